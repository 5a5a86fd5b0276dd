"""The service runtime on the real broker: a batch subscription, its commits, a failing batch's DLQ; batch sends."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.structs import ConsumerRecord

from llmbus.bus import Bus, make_consumer, stop_consumer
from llmbus.bus import headers as hdr
from llmbus.bus.codec import decode
from llmbus.bus.service import ServiceRuntime
from llmbus.bus.tables import read_log
from llmbus.contract import messages as m
from llmbus.contract import topics as t
from llmbus.contract.declarations import Contract, Reads, Writes
from llmbus.settings import BusSettings
from tests.support import eventually

pytestmark = pytest.mark.kafka

CONTRACT = Contract(
    t.COST,
    reads=(Reads("results", (t.RESULTS,), m.InferenceResult, group="runtime-test", batch_max_records=50, raw=True),),
    writes=(Writes(t.DLQ, m.DeadLetter),),
)


def result(rid: str) -> m.InferenceResult:
    return m.InferenceResult(request_id=rid, tenant="t", status=m.ResultStatus.OK, model="x")


async def run_once(settings: BusSettings, handle, until) -> ServiceRuntime:  # type: ignore[no-untyped-def]
    runtime = await ServiceRuntime.connect(settings, CONTRACT)
    runtime.subscribe("results", handle)
    await runtime.start()
    try:
        await eventually(until, timeout_s=60, interval_s=0.1)
    finally:
        await runtime.stop()
    return runtime


async def test_batches_are_committed_after_the_handler_and_a_failing_batch_is_dead_lettered(
    bus_settings: BusSettings,
) -> None:
    settings = bus_settings.model_copy(update={"commit_interval_s": 0.05})
    topics = t.Topics(settings.topic_prefix)
    writer = await Bus.start(settings, t.ROUTER)
    try:
        for i in range(30):
            await writer.publisher.publish(topics.name(t.RESULTS), result(f"r{i}"), key=f"r{i}")
    finally:
        await writer.stop()

    batches: list[list[str]] = []

    async def handle(records: list[ConsumerRecord]) -> None:
        ids = [decode(r, m.InferenceResult).request_id for r in records]
        batches.append(ids)
        if "r7" in ids:
            raise ValueError("a bug in the handler")  # not transient: every record of the batch to the DLQ

    async def all_seen() -> bool:
        return sum(map(len, batches)) >= 30

    await run_once(settings, handle, all_seen)
    seen = [rid for batch in batches for rid in batch]
    assert sorted(seen) == sorted(f"r{i}" for i in range(30)) and len(seen) == 30
    assert max(map(len, batches)) > 1  # records of one fetch come together
    letters = [letter for _, letter in await read_log(settings, topics.name(t.DLQ), m.DeadLetter)]
    failed = next(batch for batch in batches if "r7" in batch)
    assert sorted(letter.request_id or "" for letter in letters) == sorted(failed)
    assert {letter.error_code for letter in letters} == {m.ErrorCode.INTERNAL}

    # Everything was committed (the failed batch too: it is on the DLQ): a second run sees nothing.
    again: list[str] = []

    async def handle_again(records: list[ConsumerRecord]) -> None:
        again.extend(decode(r, m.InferenceResult).request_id for r in records)

    async def settled() -> bool:
        await asyncio.sleep(3)
        return True

    await run_once(settings, handle_again, settled)
    assert again == []


async def test_a_batch_send_puts_each_record_where_a_single_send_would_with_its_own_headers(
    bus_settings: BusSettings,
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    topic = topics.name(t.COSTS)  # 4 partitions
    bus = await Bus.start(bus_settings, t.COST)
    records = [m.CostRecord(request_id=f"c{i}", tenant=f"tenant-{i % 7}", model="x", cost_usd=0.0) for i in range(60)]
    try:
        await bus.publisher.delivered(
            await bus.publisher.send_batch(topic, [(r, r.to_bytes(), r.tenant) for r in records])
        )
        single = m.CostRecord(request_id="single", tenant="tenant-3", model="x", cost_usd=0.0)
        await bus.publisher.delivered([await bus.publisher.send(topic, single, key=single.tenant)])
    finally:
        await bus.stop()
    consumer = make_consumer(bus_settings, topic, group_id=None, client_id="batch-test")
    await consumer.start()
    seen: dict[str, ConsumerRecord] = {}
    try:
        deadline = asyncio.get_running_loop().time() + 30
        while len(seen) < 61 and asyncio.get_running_loop().time() < deadline:
            for part in (await consumer.getmany(timeout_ms=500)).values():
                seen.update({decode(r, m.CostRecord).request_id: r for r in part})
    finally:
        await stop_consumer(consumer, 10)
    assert len(seen) == 61
    assert seen["single"].partition == seen["c3"].partition  # the same key, the same partition
    assert len({r.partition for r in seen.values()}) > 1
    for i in range(60):
        headers = dict(seen[f"c{i}"].headers)
        assert headers[hdr.REQUEST_ID] == f"c{i}".encode() and headers[hdr.TENANT] == f"tenant-{i % 7}".encode()
        assert headers[hdr.SCHEMA] == m.CostRecord.schema_name().encode()
