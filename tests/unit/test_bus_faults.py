"""Fault handling of the bus without a broker: commit retries, bounded dead letters, edge size limit."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from aiokafka.errors import (
    CommitFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    NotLeaderForPartitionError,
)
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata, TopicPartition
from pydantic import ValidationError

from llmbus.bus import BadMessage, decode
from llmbus.bus.commits import commit_with_retry
from llmbus.bus.consumer import ConsumerLoop
from llmbus.bus.dlq import dead_letter
from llmbus.bus.producer import make_producer
from llmbus.contract.messages import DeadLetter, ErrorCode, InferenceRequest
from llmbus.settings import BusSettings


def record(value: bytes | None, key: bytes | None = None, offset: int = 7) -> ConsumerRecord:
    return ConsumerRecord("llm.requests", 3, offset, 0, 0, key, value, None, len(key or b""), len(value or b""), [])


class FlakyCommit:
    """A commit that fails with `errors` in turn, then succeeds."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)


async def test_a_broker_blip_is_ridden_out_by_retrying_the_commit() -> None:
    commit = FlakyCommit(TimeoutError(), KafkaConnectionError("broker away"), TimeoutError())
    assert await commit_with_retry(commit, timeout_s=5, service="test")
    assert commit.calls == 4


async def test_a_commit_that_keeps_timing_out_is_left_for_later_not_raised() -> None:
    async def hangs() -> None:
        await asyncio.sleep(60)

    started = asyncio.get_running_loop().time()
    assert not await commit_with_retry(hangs, timeout_s=0.3, service="test")
    assert asyncio.get_running_loop().time() - started < 2


async def test_a_commit_refused_after_a_rebalance_is_dropped_not_raised_nor_retried() -> None:
    commit = FlakyCommit(CommitFailedError("group rebalanced"))
    assert not await commit_with_retry(commit, timeout_s=5, service="test")
    assert commit.calls == 1


async def test_a_fatal_commit_error_is_raised() -> None:
    with pytest.raises(GroupAuthorizationFailedError):
        await commit_with_retry(FlakyCommit(GroupAuthorizationFailedError()), timeout_s=5, service="test")


def test_a_dead_letter_of_a_huge_record_is_bounded_and_says_where_the_original_is() -> None:
    value = b"\xff" * 900_000
    letter = dead_letter(record(value, key=b"k" * 5000, offset=42), "malformed", "x" * 10_000, "router", None)
    assert len(letter.to_bytes()) < 100_000
    assert letter.raw_truncated and letter.raw_value_size_bytes == 900_000 and letter.raw_key_size_bytes == 5000
    assert base64.b64decode(letter.raw_value_b64) == value[: 64 * 1024]
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == ("llm.requests", 3, 42)
    assert DeadLetter.model_validate_json(letter.to_bytes()) == letter


def test_a_small_record_is_dead_lettered_whole() -> None:
    letter = dead_letter(record(b"{not json", key=b"k"), "malformed", "bad", "router", "r1")
    assert not letter.raw_truncated and base64.b64decode(letter.raw_value_b64) == b"{not json"
    assert letter.raw_value_size_bytes == 9 and letter.request_id == "r1"


def test_oversize_input_is_refused_at_the_edge_with_its_request_id() -> None:
    body = {"request_id": "big-1", "tenant": "acme", "prompt": "x" * 2000}
    with pytest.raises(BadMessage) as refused:
        decode(record(json.dumps(body).encode()), InferenceRequest, max_bytes=1000)
    assert refused.value.code == ErrorCode.REQUEST_TOO_LARGE and refused.value.request_id == "big-1"
    assert refused.value.tenant == "acme" and "over the limit of 1000 bytes" in refused.value.reason
    with pytest.raises(BadMessage) as garbage:
        decode(record(b"{" * 2000), InferenceRequest, max_bytes=1000)
    assert garbage.value.code == ErrorCode.REQUEST_TOO_LARGE and garbage.value.request_id is None


def test_an_implausible_request_id_is_not_recovered() -> None:
    with pytest.raises(BadMessage) as bad:
        decode(record(json.dumps({"request_id": "r" * 100_000, "max_tokens": -1}).encode()), InferenceRequest)
    assert bad.value.request_id is None


async def test_producer_size_limit_and_durability_come_from_settings() -> None:
    settings = BusSettings(max_message_bytes=2_000_000)
    producer = make_producer(settings, "t")
    assert producer._max_request_size == 2_000_000
    assert settings.topic_max_message_bytes > settings.max_message_bytes > settings.max_request_bytes
    with pytest.raises(ValidationError):
        BusSettings(replication_factor=1, min_insync_replicas=2)
    assert BusSettings(replication_factor=3, min_insync_replicas=2).min_insync_replicas == 2


async def test_a_batch_waiting_for_a_leader_outlives_the_request_timeout() -> None:
    """aiokafka's own expiry, on the producer make_producer builds: a batch whose partition has no
    leader (a broker restarting) is not failed after request_timeout_ms, when its sender would send
    it again beside a copy that may be written already; it waits out publish_retry_s instead."""
    producer = make_producer(BusSettings(request_timeout_ms=50, publish_retry_s=0.3), "t")
    producer._txn_manager.set_pid_and_epoch(1, 0)  # what the sender fetches from the broker first
    accumulator = producer._message_accumulator  # the metadata is empty: no partition has a leader
    tp = TopicPartition("llm.results", 0)
    delivery = await accumulator.add_message(tp, b"r1", b"result", timeout=1)
    await asyncio.sleep(0.1)  # past request_timeout_ms
    accumulator.drain_by_nodes(ignore_nodes=set())
    assert not delivery.done()
    await asyncio.sleep(0.3)  # past publish_retry_s: the caller gave up long ago, the batch may go
    accumulator.drain_by_nodes(ignore_nodes=set())
    with pytest.raises(NotLeaderForPartitionError):
        await delivery


async def test_records_are_handled_while_a_commit_waits_for_the_group_coordinator() -> None:
    """The broker leading a group's __consumer_offsets partition is lost: a commit waits until a new
    coordinator is elected (aiokafka looks it up again and again). Polling and handling go on
    meanwhile, with one commit in flight, and the offsets reach the new coordinator once it is up."""
    tp = TopicPartition("llm.outcomes", 0)
    coordinator_back = asyncio.Event()
    handled: list[int] = []

    class CoordinatorAway:
        def __init__(self) -> None:
            self.next_offset = 0
            self.commits_started = 0
            self.committed: dict[TopicPartition, int] = {}

        def assignment(self) -> set[TopicPartition]:
            return {tp}

        def highwater(self, _: TopicPartition) -> None:
            return None

        async def getmany(self, **_: object) -> dict[TopicPartition, list[ConsumerRecord]]:
            await asyncio.sleep(0.002)
            offset, self.next_offset = self.next_offset, self.next_offset + 1
            return {tp: [ConsumerRecord(tp.topic, tp.partition, offset, 0, 0, None, b"o", None, 0, 1, [])]}

        async def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
            self.commits_started += 1
            await coordinator_back.wait()
            self.committed.update({p: o.offset for p, o in offsets.items()})

    async def handle(r: ConsumerRecord) -> None:
        handled.append(r.offset)

    async def never(*_: object) -> None:
        raise AssertionError

    consumer = CoordinatorAway()
    settings = BusSettings(commit_interval_s=0.01, commit_timeout_s=60, poll_timeout_ms=10)
    loop = ConsumerLoop(consumer, handle, never, settings, service="t", max_in_flight=8)  # type: ignore[arg-type]
    stop = asyncio.Event()
    run = asyncio.create_task(loop.run(stop))
    try:
        async with asyncio.timeout(5):  # far below commit_timeout_s: the commit is still waiting
            while len(handled) < 50:
                await asyncio.sleep(0.01)
        assert consumer.commits_started == 1 and not consumer.committed
        coordinator_back.set()
        async with asyncio.timeout(5):
            while consumer.committed.get(tp, 0) < 50:
                await asyncio.sleep(0.01)
    finally:
        coordinator_back.set()
        stop.set()
        await asyncio.wait_for(run, 10)
    assert consumer.committed[tp] == max(handled) + 1
