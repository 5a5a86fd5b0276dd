"""The FastStream wiring in memory (TestKafkaBroker) over the real Redis: records in, comparisons and DLQ out."""

from __future__ import annotations

import pytest
from faststream.kafka import TestKafkaBroker

from llmbus import topics as t
from llmbus.lifecycle import create
from llmbus.messages import InferenceResult, ResultStatus, Timings
from llmbus.settings import BusSettings
from services.shadow_comparator.app import build
from services.shadow_comparator.config import ComparatorSettings
from tests.support import fresh_settings

pytestmark = pytest.mark.redis


def result(rid: str, shadow: bool = False) -> bytes:
    return InferenceResult(
        request_id=rid,
        tenant="t",
        status=ResultStatus.OK,
        model="cand" if shadow else "ctrl",
        text="a b c",
        timings=Timings(ttft_ms=5, total_ms=50),
        shadow=shadow,
    ).to_bytes()


async def test_handlers_join_publish_and_dead_letter(redis_up: None) -> None:
    settings: BusSettings = fresh_settings()
    topics = t.Topics(settings.topic_prefix)
    _, broker, handlers = build(settings, ComparatorSettings(decide=False))
    comparisons: list[dict[str, object]] = []
    letters: list[dict[str, object]] = []

    @broker.subscriber(topics.name(t.COMPARISONS))
    async def on_comparison(body: dict[str, object]) -> None:
        comparisons.append(body)

    @broker.subscriber(topics.name(t.DLQ))
    async def on_letter(body: dict[str, object]) -> None:
        letters.append(body)

    async with TestKafkaBroker(broker) as test_broker:
        experiment = create("exp", "ctrl", "cand")
        await test_broker.publish(experiment.to_bytes(), topics.name(t.EXPERIMENTS), key=b"exp")
        await test_broker.publish(result("r1"), topics.name(t.RESULTS), key=b"r1")
        await test_broker.publish(result("r1.shadow.exp", shadow=True), topics.name(t.RESULTS), key=b"r1.shadow.exp")
        await test_broker.publish(b"not json", topics.name(t.RESULTS), key=b"junk")
        await test_broker.publish(None, topics.name(t.EXPERIMENTS), key=b"exp")  # tombstone: forgotten
    assert [c["comparison_id"] for c in comparisons] == ["r1:exp"]
    assert comparisons[0]["similarity"] == 1.0
    assert [letter["error_code"] for letter in letters] == ["malformed"]
    assert "exp" not in handlers.comparator.experiments.by_id
    await handlers.comparator.store.drop()
    await handlers.comparator.store.close()
