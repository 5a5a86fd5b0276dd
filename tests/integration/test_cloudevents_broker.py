"""A plain CloudEvents consumer (the SDK's Kafka binding) reads every analytics topic off the real broker.

Records are published the ways services publish them, through the one Publisher: one at a time
(results, comparisons, decisions, scaling, budgets) and in batches as cost-accounting does (costs),
then read back with a bare aiokafka consumer, as an analytics job would.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer
from cloudevents.core.bindings.kafka import KafkaMessage, from_binary_event

from llmbus.bus import Bus
from llmbus.contract import topics as t
from llmbus.settings import BusSettings
from tests.contract_samples import SAMPLES

pytestmark = [pytest.mark.kafka]


async def read_one(settings: BusSettings, topic: str, timeout_s: float = 30) -> KafkaMessage:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=settings.kafka_bootstrap, group_id=None, auto_offset_reset="earliest"
    )
    try:
        await asyncio.wait_for(consumer.start(), 30)
        record = await asyncio.wait_for(consumer.getone(), timeout_s)
    finally:
        await asyncio.wait_for(consumer.stop(), 30)
    key = record.key.decode() if record.key is not None else None
    return KafkaMessage(headers={k: v for k, v in record.headers}, key=key, value=record.value or b"")


async def test_every_analytics_topic_parses_as_cloudevents(bus_settings: BusSettings) -> None:
    bus = await Bus.start(bus_settings, t.COST)
    try:
        for sample in SAMPLES:
            topic = bus.topics.name(sample.topic)
            if sample.topic == t.COSTS:  # as cost-accounting publishes: a batch, each record its own headers
                await bus.publisher.publish_many(
                    topic,
                    [(sample.message, sample.message.to_bytes(), sample.key)],  # type: ignore[list-item]
                )
            else:
                await bus.publisher.publish(topic, sample.message, key=sample.key)
    finally:
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
        if sample.topic in (t.RESULTS, t.COSTS):  # the OTel GenAI names where they apply, nested by their dots
            gen_ai = event.get_data()["gen_ai"]
            assert gen_ai["response"]["model"] == "m", sample.topic
            assert set(gen_ai["usage"]) == {"input_tokens", "output_tokens", "cache_read"}, sample.topic
