"""The consumer loop under faults, on the real broker: rebalances while saturated, commits refused
after the group moved on, a DLQ that cannot be written, topics created from the durability settings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import InvalidReplicationFactorError
from aiokafka.structs import ConsumerRecord

from llmbus.bus import ConsumerLoop, make_consumer, stop_consumer
from llmbus.bus.admin import ensure_topics, open_admin
from llmbus.bus.catch_up import wait_assigned
from llmbus.contract.messages import InferenceRequest
from llmbus.contract.topics import TopicSpec
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import drop_namespace, fresh_settings
from tests.integration.test_consumer_loop import produce
from tests.support import eventually, until

pytestmark = pytest.mark.kafka

Seen = set[tuple[int, int]]  # (partition, offset)


@pytest.fixture
async def kafka_settings(kafka_up: None) -> AsyncIterator[BusSettings]:
    """A fresh namespace for this module's own topics (no catalog, no Redis needed)."""
    settings = fresh_settings()
    yield settings
    await drop_namespace(settings)


async def make_topic(settings: BusSettings, partitions: int, name: str = "faults.test") -> str:
    topic = f"{settings.topic_prefix}{name}"
    await ensure_topics(settings, [(topic, TopicSpec(topic, "k", InferenceRequest, partitions=partitions))])
    return topic


async def committed(consumer: AIOKafkaConsumer, topic: str, partitions: int) -> dict[int, int]:
    found = {}
    for p in range(partitions):
        offset = await asyncio.wait_for(consumer.committed(TopicPartition(topic, p)), 10)
        found[p] = offset or 0
    return found


async def start_loop(
    settings: BusSettings,
    topic: str,
    handler: Callable[[ConsumerRecord], Awaitable[None]],
    on_error: Callable[[ConsumerRecord, Exception], Awaitable[None]],
    *,
    max_in_flight: int,
    group: str = "g",
    **consumer_overrides: object,
) -> tuple[AIOKafkaConsumer, asyncio.Task[None], asyncio.Event]:
    consumer = make_consumer(
        settings,
        group_id=f"{settings.topic_prefix}{group}",
        client_id="faults-test",
        **consumer_overrides,  # type: ignore[arg-type]
    )
    loop = ConsumerLoop(
        consumer, handler, on_error, settings, service="test", max_in_flight=max_in_flight, drain_grace_s=0.5
    )
    consumer.subscribe([topic], listener=loop.rebalance_listener())
    await asyncio.wait_for(consumer.start(), 30)
    await wait_assigned(consumer, 30)
    stop = asyncio.Event()
    return consumer, asyncio.create_task(loop.run(stop)), stop


async def stop_loop(consumer: AIOKafkaConsumer, task: asyncio.Task[None], stop: asyncio.Event) -> None:
    stop.set()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 30)
    await stop_consumer(consumer, 10)


async def fail(record: ConsumerRecord, exc: Exception) -> None:
    raise AssertionError(f"unexpected handler error {exc!r}")


async def test_a_saturated_loop_skips_nothing_across_rebalances(kafka_settings: BusSettings) -> None:
    """max_in_flight=1, and a record in flight across each rebalance (a member joining, then leaving):
    the loop is saturated while the group hands it fresh, unpaused partitions, and keeps polling."""
    settings = kafka_settings.model_copy(update={"commit_interval_s": 0.05})
    partitions, per_partition = 4, 10
    topic = await make_topic(settings, partitions)
    await produce(settings, topic, [(i % partitions, f"v{i}".encode()) for i in range(partitions * per_partition)])
    everything = {(p, o) for p in range(partitions) for o in range(per_partition)}
    handled: Seen = set()
    commit_violations: list[str] = []
    hold, held, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def handler(record: ConsumerRecord) -> None:
        if hold.is_set():  # this record stays in flight until the test lets it go
            hold.clear()
            held.set()
            await release.wait()
        await asyncio.sleep(0.05)
        handled.add((record.partition, record.offset))

    async def with_a_record_in_flight(rebalance: Callable[[], Awaitable[None]]) -> None:
        held.clear()
        release.clear()
        hold.set()
        try:
            await asyncio.wait_for(held.wait(), 10)
        except TimeoutError:
            raise AssertionError(f"nothing delivered for 10 s, never handled: {sorted(everything - handled)}") from None
        await rebalance()
        await asyncio.sleep(0.8)  # saturated, polling, on partitions the rebalance just handed out
        release.set()

    # Short heartbeats: the loop learns of each rebalance sooner (the test is about what happens then).
    consumer, task, stop = await start_loop(settings, topic, handler, fail, max_in_flight=1, heartbeat_interval_ms=300)
    joiner = make_consumer(
        settings, topic, group_id=f"{settings.topic_prefix}g", client_id="joiner", heartbeat_interval_ms=300
    )

    async def join() -> None:
        await asyncio.wait_for(joiner.start(), 30)
        await wait_assigned(joiner, 30)
        await until(lambda: len(consumer.assignment()) == partitions // 2, 30)

    async def leave() -> None:
        await stop_consumer(joiner, 10)
        await until(lambda: len(consumer.assignment()) == partitions, 30)

    async def commits_never_pass_an_unhandled_record() -> None:
        while True:
            for p, offset in (await committed(consumer, topic, partitions)).items():
                missing = [o for o in range(offset) if (p, o) not in handled]
                if missing:
                    commit_violations.append(f"partition {p} committed {offset}, unhandled {missing}")
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(commits_never_pass_an_unhandled_record())
    try:
        await with_a_record_in_flight(join)
        await with_a_record_in_flight(leave)
        await until(lambda: everything <= handled, 30)
        await eventually(lambda: _all_committed(consumer, topic, partitions, per_partition), timeout_s=10)
    finally:
        watcher.cancel()
        release.set()
        await stop_consumer(joiner, 10)
        await stop_loop(consumer, task, stop)
    assert everything <= handled, f"skipped: {sorted(everything - handled)}"
    assert not commit_violations, commit_violations[:3]


async def _all_committed(consumer: AIOKafkaConsumer, topic: str, partitions: int, per_partition: int) -> bool:
    return set((await committed(consumer, topic, partitions)).values()) == {per_partition}


async def test_a_commit_refused_after_the_group_moved_on_does_not_stop_the_loop(kafka_settings: BusSettings) -> None:
    """The member's heartbeats stop reaching the coordinator (the fault injected), the broker expels it,
    its next commit fails with CommitFailedError: the loop rejoins and goes on; records are redelivered."""
    settings = kafka_settings.model_copy(update={"commit_interval_s": 0.05})
    topic = await make_topic(settings, 1)
    group = f"{settings.topic_prefix}g"
    handled: list[int] = []

    async def handler(record: ConsumerRecord) -> None:
        handled.append(record.offset)

    consumer, task, stop = await start_loop(
        settings, topic, handler, fail, max_in_flight=4, session_timeout_ms=6000, heartbeat_interval_ms=500
    )
    coordinator = consumer._coordinator  # type: ignore[attr-defined]
    heartbeats_back = asyncio.Event()

    async def heartbeat_lost() -> bool:
        await heartbeats_back.wait()
        return False

    try:
        await produce(settings, topic, [(0, f"v{i}".encode()) for i in range(5)])
        await eventually(lambda: _all_committed(consumer, topic, 1, 5), timeout_s=20)
        coordinator._do_heartbeat = heartbeat_lost

        async def expelled() -> bool:
            async with open_admin(settings) as admin:
                [described] = await asyncio.wait_for(admin.describe_consumer_groups([group]), 10)
            return not described.groups[0][5]  # error, group, state, protocol type, protocol, members

        await eventually(expelled, timeout_s=30, interval_s=0.5)
        await produce(settings, topic, [(0, f"v{i}".encode()) for i in range(5, 10)])  # handled, commit refused
        await until(lambda: task.done() or set(handled) >= set(range(10)), 20)
        await asyncio.sleep(1)
        assert not task.done(), f"the loop stopped: {task.exception() if task.done() else ''}"
        del coordinator._do_heartbeat
        heartbeats_back.set()
        await eventually(lambda: _all_committed(consumer, topic, 1, 10), timeout_s=30)
        assert not task.done()
    finally:
        heartbeats_back.set()
        await stop_loop(consumer, task, stop)


async def test_a_dead_letter_that_cannot_be_written_does_not_stop_the_loop(kafka_settings: BusSettings) -> None:
    settings = kafka_settings.model_copy(update={"commit_interval_s": 0.05})
    topic = await make_topic(settings, 1)
    await produce(settings, topic, [(0, f"v{i}".encode()) for i in range(10)])
    handled: list[bytes] = []

    async def handler(record: ConsumerRecord) -> None:
        if record.value == b"v3":
            raise ValueError("poison")
        handled.append(record.value)

    async def dlq_down(record: ConsumerRecord, exc: Exception) -> None:
        raise RuntimeError("the DLQ is unwritable")

    consumer, task, stop = await start_loop(settings, topic, handler, dlq_down, max_in_flight=4)
    try:
        await until(lambda: len(handled) == 9, 20)
        await eventually(lambda: _all_committed(consumer, topic, 1, 10), timeout_s=10)
        assert not task.done()
    finally:
        await stop_loop(consumer, task, stop)


def set_on_topic(entry: tuple[object, ...]) -> bool:
    source = entry[3]  # DescribeConfigs v0: is_default; v1+: config_source (1: DYNAMIC_TOPIC_CONFIG)
    return source is False if isinstance(source, bool) else source == 1


async def test_topics_take_replication_and_min_insync_replicas_from_settings(kafka_settings: BusSettings) -> None:
    topic = await make_topic(kafka_settings, 1, name="durable.test")
    entries: dict[str, tuple[object, ...]] = {}

    async def described() -> bool:  # a topic just created may not be described yet
        async with open_admin(kafka_settings) as admin:
            [response] = await asyncio.wait_for(
                admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)]), 10
            )
        [resource] = response.resources  # error, message, type, name, entries (name, value, read_only, source, ..)
        entries.update({entry[0]: entry for entry in resource[4]})
        return bool(entries)

    await eventually(described, timeout_s=15, interval_s=0.2)
    min_isr, max_bytes = entries["min.insync.replicas"], entries["max.message.bytes"]
    assert min_isr[1] == "1" and set_on_topic(min_isr), "set on the topic, not left to the broker"
    assert int(str(max_bytes[1])) == kafka_settings.topic_max_message_bytes and set_on_topic(max_bytes)
    # A factor this one-broker cluster cannot meet fails loudly instead of quietly keeping one copy.
    three = kafka_settings.model_copy(update={"replication_factor": 3, "min_insync_replicas": 2})
    with pytest.raises(InvalidReplicationFactorError):
        await make_topic(three, 1, name="replicated.test")
