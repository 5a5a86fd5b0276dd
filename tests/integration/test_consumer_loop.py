"""The consumer loop on the real broker: ordered commits, redelivery of unfinished work, DLQ path."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from llmbus.bus import ConsumerLoop, make_consumer, stop_consumer
from llmbus.bus.admin import ensure_topics
from llmbus.contract.messages import InferenceRequest
from llmbus.contract.topics import TopicSpec
from llmbus.settings import BusSettings

pytestmark = pytest.mark.kafka


async def make_topic(settings: BusSettings, partitions: int) -> str:
    name = f"{settings.topic_prefix}loop.test"
    await ensure_topics(settings, [(name, TopicSpec(name, "k", InferenceRequest, partitions=partitions))])
    return name


async def produce(settings: BusSettings, topic: str, values: list[tuple[int, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for partition, value in values:
            await asyncio.wait_for(producer.send_and_wait(topic, value, partition=partition), 30)
    finally:
        await producer.stop()


async def run_loop(
    settings: BusSettings,
    topic: str,
    handler,
    on_error,
    *,
    max_in_flight: int,  # type: ignore[no-untyped-def]
    until,
    timeout_s: float = 30,
) -> None:
    consumer = make_consumer(settings, group_id=f"{settings.topic_prefix}g", client_id="loop-test")
    loop = ConsumerLoop(
        consumer, handler, on_error, settings, service="test", max_in_flight=max_in_flight, drain_grace_s=0.5
    )
    consumer.subscribe([topic], listener=loop.rebalance_listener())
    await consumer.start()
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        await asyncio.wait_for(until(), timeout_s)
    finally:
        stop.set()
        await task
        await stop_consumer(consumer, 10)


async def test_unfinished_records_are_redelivered_and_finished_ones_are_not(bus_settings: BusSettings) -> None:
    settings = bus_settings.model_copy(update={"commit_interval_s": 0.05})
    topic = await make_topic(settings, partitions=2)
    await produce(settings, topic, [(i % 2, f"v{i}".encode()) for i in range(20)])

    handled: list[bytes] = []
    blocked = asyncio.Event()  # never set: v9 (partition 1, its 5th record) hangs until the loop stops
    errors: list[bytes] = []

    async def slow_then_stuck(record: ConsumerRecord) -> None:
        if record.value == b"v9":
            await blocked.wait()
        if record.value == b"v4":
            raise ValueError("bad record")
        await asyncio.sleep(0.01 * (record.offset % 3))  # finish out of order
        handled.append(record.value)

    async def on_error(record: ConsumerRecord, exc: Exception) -> None:
        errors.append(record.value)

    async def all_but_stuck_done() -> None:
        while len(handled) + len(errors) < 19:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # a few commit intervals

    await run_loop(settings, topic, slow_then_stuck, on_error, max_in_flight=8, until=all_but_stuck_done)
    assert errors == [b"v4"], "a failing record goes to on_error (the DLQ) and counts as done"
    assert b"v9" not in handled

    redelivered: list[bytes] = []

    async def record_all(record: ConsumerRecord) -> None:
        redelivered.append(record.value)

    async def some_arrived() -> None:
        while len(redelivered) < 6:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)

    await run_loop(settings, topic, record_all, on_error, max_in_flight=8, until=some_arrived)
    # Partition 1 resumes at v9 (the stuck one) and replays what came after it; partition 0 nothing.
    assert sorted(redelivered) == sorted([b"v9", b"v11", b"v13", b"v15", b"v17", b"v19"])


async def test_backpressure_bounds_records_in_flight(bus_settings: BusSettings) -> None:
    topic = await make_topic(bus_settings, partitions=1)
    await produce(bus_settings, topic, [(0, f"v{i}".encode()) for i in range(30)])
    in_flight = 0
    peak = 0
    done = 0

    async def handler(record: ConsumerRecord) -> None:
        nonlocal in_flight, peak, done
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        done += 1

    async def on_error(record: ConsumerRecord, exc: Exception) -> None:
        raise AssertionError(exc)

    async def all_done() -> None:
        while done < 30:
            await asyncio.sleep(0.02)

    await run_loop(bus_settings, topic, handler, on_error, max_in_flight=4, until=all_done)
    assert peak == 4
