"""A plain CloudEvents consumer (the SDK's Kafka binding) reads every analytics topic off the real broker.

Records are published the ways services publish them: through the Publisher (results), FastStream's
broker with llmbus headers (comparisons, decisions, scaling, budgets) and cost-accounting's batch
publisher (costs), then read back with a bare aiokafka consumer, as an analytics job would.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer
from cloudevents.core.bindings.kafka import KafkaMessage, from_binary_event
from faststream.kafka import KafkaBroker

from llmbus import topics as t
from llmbus.bus import Bus
from llmbus.bus import headers as hdr
from llmbus.settings import BusSettings
from services.cost_accounting.costs_publisher import CostsPublisher
from tests.contract_samples import SAMPLES

pytestmark = [pytest.mark.kafka]
FASTSTREAM_PUBLISHED = (t.COMPARISONS, t.DECISIONS, t.SCALING, t.BUDGETS)


async def read_one(settings: BusSettings, topic: str, timeout_s: float = 30) -> KafkaMessage:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=settings.kafka_bootstrap, group_id=None, auto_offset_reset="earliest"
    )
    await asyncio.wait_for(consumer.start(), 30)
    try:
        record = await asyncio.wait_for(consumer.getone(), timeout_s)
    finally:
        await asyncio.wait_for(consumer.stop(), 30)
    key = record.key.decode() if record.key is not None else None
    return KafkaMessage(headers={k: v for k, v in record.headers}, key=key, value=record.value or b"")


async def test_every_analytics_topic_parses_as_cloudevents(bus_settings: BusSettings) -> None:
    bus = await Bus.start(bus_settings, t.COST)
    costs = CostsPublisher(bus_settings, bus.topics.name(t.COSTS))
    await costs.start()
    broker = KafkaBroker(bus_settings.kafka_bootstrap)
    await asyncio.wait_for(broker.connect(), 30)
    try:
        for sample in SAMPLES:
            topic = bus.topics.name(sample.topic)
            if sample.topic == t.COSTS:
                await costs.publish([(sample.message, sample.message.to_bytes(), sample.key)])  # type: ignore[list-item]
            elif sample.topic in FASTSTREAM_PUBLISHED:  # as the autoscaler and the comparator publish
                headers = {k: v.decode() for k, v in hdr.outgoing(sample.message, t.COST)}
                await asyncio.wait_for(
                    broker.publish(sample.message.to_bytes(), topic, key=sample.key.encode(), headers=headers), 20
                )
            else:
                await bus.publisher.publish(topic, sample.message, key=sample.key)
    finally:
        await asyncio.wait_for(broker.stop(), 30)
        await costs.stop()
        await bus.stop()
    assert {s.topic for s in SAMPLES} == {t.RESULTS, t.COSTS, t.COMPARISONS, t.DECISIONS, t.SCALING, t.BUDGETS}
    for sample in SAMPLES:
        event = from_binary_event(await read_one(bus_settings, bus.topics.name(sample.topic)))
        assert (event.get_specversion(), event.get_id(), event.get_type(), event.get_subject()) == (
            "1.0",
            sample.ce_id,
            sample.ce_type,
            sample.ce_subject,
        ), sample.topic
        assert event.get_source() == f"/llmbus/{t.COST}"
        assert event.get_data() == sample.message.model_dump(mode="json", exclude_none=True)
        assert event.get_extension("partitionkey") == sample.key
