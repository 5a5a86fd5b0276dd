"""The wiring in memory (llmbus.bus.memory) over the real Redis: records in, comparisons and DLQ out."""

from __future__ import annotations

import pytest

from llmbus.bus.memory import MemoryBus
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import Comparison, DeadLetter, InferenceResult, ResultStatus, Timings
from llmbus.domain.lifecycle import create
from llmbus.settings import BusSettings
from llmbus_services.shadow_comparator.app import build
from llmbus_services.shadow_comparator.config import ComparatorSettings
from llmbus_tools.harness.service_procs import fresh_settings

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
    bus = MemoryBus(settings)
    runtime = bus.runtime(contracts.COMPARATOR)
    topics = bus.topics
    handlers = build(runtime, ComparatorSettings(decide=False))
    experiment = create("exp", "ctrl", "cand")
    await bus.send(topics.name(t.EXPERIMENTS), experiment, key="exp")
    await bus.send(topics.name(t.RESULTS), result("r1"), key="r1")
    await bus.send(topics.name(t.RESULTS), result("r1.shadow.exp", shadow=True), key="r1.shadow.exp")
    await bus.send(topics.name(t.RESULTS), b"not json", key="junk")
    await bus.send(topics.name(t.EXPERIMENTS), None, key="exp")  # tombstone: forgotten
    comparisons = bus.published(topics.name(t.COMPARISONS), Comparison)
    assert [c.comparison_id for c in comparisons] == ["t:r1:exp"]
    assert comparisons[0].similarity == 1.0
    letters = bus.published(topics.name(t.DLQ), DeadLetter)
    assert [letter.error_code for letter in letters] == ["malformed"]
    assert not runtime.contract.undeclared(topics, runtime.publisher.topics_written)
    assert "exp" not in handlers.comparator.experiments.by_id
    await handlers.comparator.store.drop()
    await handlers.comparator.store.close()
