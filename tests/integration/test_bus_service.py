"""The service runtime on the real broker: a batch subscription, its commits, a failing batch's DLQ; batch
sends; the followed state read to its end before serving; a rebalance's hand-over; a drain past its grace."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.structs import ConsumerRecord, TopicPartition

from llmbus.bus import Bus, make_consumer, stop_consumer
from llmbus.bus import headers as hdr
from llmbus.bus.codec import decode
from llmbus.bus.service import Phase, ServiceRuntime
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
    await publish_results(settings, [f"r{i}" for i in range(30)])

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
        await bus.publisher.publish_many(topic, [(r, r.to_bytes(), r.tenant) for r in records])
        single = m.CostRecord(request_id="single", tenant="tenant-3", model="x", cost_usd=0.0)
        await bus.publisher.delivered([await bus.publisher.publish(topic, single, key=single.tenant, wait=False)])
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


FOLLOWING = Contract(
    t.ROUTER,
    reads=(
        Reads("models", (t.MODELS,), m.ModelSpec, group=None, raw=True),
        Reads("results", (t.RESULTS,), m.InferenceResult, group="runtime-follow", raw=True),
    ),
    writes=(Writes(t.DLQ, m.DeadLetter),),
)


async def test_the_followed_state_is_read_to_its_end_before_the_service_serves(bus_settings: BusSettings) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    writer = await Bus.start(bus_settings, t.CLIENT)
    try:
        for i in range(200):
            await writer.publisher.publish(topics.name(t.MODELS), m.ModelSpec(name=f"m{i}"), key=f"m{i}")
        await writer.publisher.publish(topics.name(t.RESULTS), result("r0"), key="r0")
    finally:
        await writer.stop()
    runtime = await ServiceRuntime.connect(bus_settings, FOLLOWING)
    models: list[tuple[str, bool]] = []
    models_when_serving: list[int] = []

    async def on_model(record: ConsumerRecord) -> None:
        await asyncio.sleep(0.001)  # applying takes time: serving must still wait for all of them
        models.append((decode(record, m.ModelSpec).name, runtime.replayed(record)))

    async def on_result(record: ConsumerRecord) -> None:
        models_when_serving.append(len(models))

    async def serving() -> None:
        models_when_serving.append(len(models))

    runtime.subscribe("models", on_model)
    runtime.subscribe("results", on_result)
    runtime.on_start(serving, Phase.SERVING)
    try:
        await runtime.start()
        assert runtime.caught_up.is_set() and runtime.ready.is_set()
        await runtime.publisher.publish(topics.name(t.MODELS), m.ModelSpec(name="new"), key="new")
        await eventually(lambda: _true(len(models) == 201 and len(models_when_serving) == 2), timeout_s=30)
    finally:
        await runtime.stop()
    assert models_when_serving == [200, 200] or (models_when_serving[0] == 200 and models_when_serving[1] >= 200)
    assert all(replayed for _, replayed in models[:200]) and models[200] == ("new", False)


async def test_a_revoked_partition_is_handed_over_uncommitted_to_the_next_owner(bus_settings: BusSettings) -> None:
    """What the first instance still holds for the partitions a second one takes is handed over
    (its handlers cancelled before the commit), so the second instance reads those records again."""
    settings = bus_settings.model_copy(update={"commit_interval_s": 0.05})
    contract = results_read_by("handover", max_in_flight=100)
    await publish_results(settings, [f"r{i}" for i in range(40)])

    held: dict[str, tuple[TopicPartition, asyncio.Future[None]]] = {}
    revoked: list[set[TopicPartition]] = []

    async def hold(record: ConsumerRecord) -> None:  # waits until handed over (the scheduler's queued requests)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        held[decode(record, m.InferenceResult).request_id] = (TopicPartition(record.topic, record.partition), future)
        await future

    def hand_over(partitions: set[TopicPartition]) -> None:
        revoked.append(partitions)
        for tp, future in held.values():
            if tp in partitions:
                future.cancel()

    first = await ServiceRuntime.connect(settings, contract)
    first.subscribe("results", hold, on_revoke=hand_over, retries=False)
    second = await ServiceRuntime.connect(settings, contract)
    taken: list[str] = []

    async def take(record: ConsumerRecord) -> None:
        taken.append(decode(record, m.InferenceResult).request_id)

    second.subscribe("results", take, retries=False)
    try:
        await first.start()
        await eventually(lambda: _true(len(held) == 40), timeout_s=60)
        await second.start()
        await eventually(lambda: _true(bool(revoked) and len(taken) > 0), timeout_s=60)
        moved = {tp for partitions in revoked for tp in partitions}
        expected = {rid for rid, (tp, _) in held.items() if tp in moved and tp in second_assignment(second)}
        await eventually(lambda: _true(expected <= set(taken)), timeout_s=30)
        assert expected and set(taken) <= {rid for rid, (tp, _) in held.items() if tp in moved}
    finally:
        for _, future in held.values():
            if not future.done():
                future.set_result(None)
        await second.stop()
        await first.stop()


def second_assignment(runtime: ServiceRuntime) -> set[TopicPartition]:
    subscriptions = runtime._subscriptions
    assert subscriptions is not None
    return set(subscriptions.entries[0].consumer.assignment())


async def test_a_drain_past_its_grace_gives_back_what_still_runs_and_commits_it(bus_settings: BusSettings) -> None:
    settings = bus_settings.model_copy(update={"commit_interval_s": 0.05})
    contract = results_read_by("drain", max_in_flight=10)
    await publish_results(settings, ["long"])
    given_back = asyncio.Event()
    events: list[str] = []

    async def run_long(record: ConsumerRecord) -> None:
        events.append("started")
        await given_back.wait()  # the worker's request, aborted once the grace is over
        events.append("handed back")

    async def abort_all() -> None:
        events.append("grace over")
        given_back.set()

    runtime = await ServiceRuntime.connect(settings, contract)
    runtime.subscribe("results", run_long, drain_grace_s=0.5, grace_over=abort_all, retries=False)
    await runtime.start()
    try:
        await eventually(lambda: _true(events == ["started"]), timeout_s=30)
    finally:
        await runtime.stop()
    assert events == ["started", "grace over", "handed back"]
    again: list[ConsumerRecord] = []

    async def nothing_left(record: ConsumerRecord) -> None:
        again.append(record)

    runtime = await ServiceRuntime.connect(settings, contract)
    runtime.subscribe("results", nothing_left)
    await runtime.start()
    await asyncio.sleep(3)
    await runtime.stop()
    assert again == []  # it finished in the drain, so it was committed


def results_read_by(group: str, max_in_flight: int) -> Contract:
    reads = Reads("results", (t.RESULTS,), m.InferenceResult, group=group, max_in_flight=max_in_flight, raw=True)
    return Contract(t.COST, reads=(reads,), writes=(Writes(t.DLQ, m.DeadLetter),))


async def publish_results(settings: BusSettings, request_ids: list[str]) -> None:
    writer = await Bus.start(settings, t.ROUTER)
    try:
        for rid in request_ids:
            await writer.publisher.publish(t.Topics(settings.topic_prefix).name(t.RESULTS), result(rid), key=rid)
    finally:
        await writer.stop()


async def _true(value: bool) -> bool:
    return value
