"""llmbus.bus.catch_up on the real broker: read to the end offsets as of a moment, no further, and
every wait bounded (a transaction's commit marker ends a partition on an offset that is no record)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from llmbus.bus.admin import ensure_topics
from llmbus.bus.catch_up import NotReadToEnd, assigned_ends, reached, read_to_end, wait_assigned
from llmbus.contract.messages import InferenceRequest
from llmbus.contract.topics import TopicSpec
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import drop_namespace, fresh_settings
from tests.integration.test_consumer_loop import produce

pytestmark = pytest.mark.kafka
PARTITIONS = 3


@pytest.fixture
async def topic(kafka_up: None) -> AsyncIterator[tuple[BusSettings, str]]:
    settings = fresh_settings()
    name = f"{settings.topic_prefix}catch-up.test"
    await ensure_topics(settings, [(name, TopicSpec(name, "k", InferenceRequest, partitions=PARTITIONS))])
    yield settings, name
    await drop_namespace(settings)


async def transactional_write(settings: BusSettings, topic: str, value: bytes) -> None:
    """One committed record on partition 0: its commit marker takes the offset after it."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, transactional_id=f"{topic}-tx")
    try:
        await asyncio.wait_for(producer.start(), 30)
        async with producer.transaction():
            await asyncio.wait_for(producer.send_and_wait(topic, value, partition=0), 30)
    finally:
        await asyncio.wait_for(producer.stop(), 30)


def group_less(settings: BusSettings, *topics: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )


async def test_reads_every_record_below_the_ends_and_stops_there(topic: tuple[BusSettings, str]) -> None:
    settings, name = topic
    before = [(i % PARTITIONS, f"before-{i}".encode()) for i in range(30)]
    await produce(settings, name, before)
    await transactional_write(settings, name, b"in-a-transaction")
    consumer = group_less(settings, name)
    try:
        await asyncio.wait_for(consumer.start(), 30)
        # The coordinator writes the commit marker after the commit returns: until then the
        # read_committed end (the last stable offset) stays below the transaction's record.
        deadline = asyncio.get_running_loop().time() + 30
        while sum((ends := await assigned_ends(consumer, 30)).values()) < 32:
            assert asyncio.get_running_loop().time() < deadline, ends
            await asyncio.sleep(0.1)
        assert sum(ends.values()) == 32  # 30 records, the transaction's record and its commit marker
        await produce(settings, name, [(p, b"after") for p in range(PARTITIONS)])
        seen = [(r.partition, r.value) async for r in read_to_end(consumer, ends, 60, call_timeout_s=30)]
        assert await reached(consumer, ends, 30)
    finally:
        await asyncio.wait_for(consumer.stop(), 30)
    expected = [*before, (0, b"in-a-transaction")]
    assert sorted(seen) == sorted(expected)
    for p in range(PARTITIONS):  # in offset order within each partition
        assert [v for q, v in seen if q == p] == [v for q, v in expected if q == p]


async def test_a_partition_short_of_its_end_fails_at_the_deadline(topic: tuple[BusSettings, str]) -> None:
    settings, name = topic
    await produce(settings, name, [(0, b"only")])
    consumer = group_less(settings, name)
    try:
        await asyncio.wait_for(consumer.start(), 30)
        ends = await assigned_ends(consumer, 30)
        beyond = {tp: end + 1 for tp, end in ends.items()}  # an offset that will not be written
        started = asyncio.get_running_loop().time()
        with pytest.raises(NotReadToEnd) as short:
            async for _ in read_to_end(consumer, beyond, 2, call_timeout_s=30):
                pass
        assert asyncio.get_running_loop().time() - started < 15
        assert short.value.pending == set(beyond)
    finally:
        await asyncio.wait_for(consumer.stop(), 30)


async def test_waiting_for_partitions_that_never_come_is_bounded(kafka_up: None) -> None:
    consumer = group_less(fresh_settings())  # subscribed to nothing: no partition will ever come
    try:
        await asyncio.wait_for(consumer.start(), 30)
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await wait_assigned(consumer, 1)
        assert asyncio.get_running_loop().time() - started < 10
    finally:
        await asyncio.wait_for(consumer.stop(), 30)
