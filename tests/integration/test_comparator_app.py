"""The shadow-comparator's own wiring (app.build) in memory and on the real broker, over the real Redis: an
experiment followed, a primary and its shadow joined into one comparison, a bad record dead-lettered, a
tombstone forgetting the experiment."""

from __future__ import annotations

import pytest

from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import Comparison, DeadLetter, InferenceResult, ResultStatus, Timings
from llmbus.domain.lifecycle import create
from llmbus_services.shadow_comparator.app import build
from llmbus_services.shadow_comparator.config import ComparatorSettings
from tests.fixtures.buses import EitherBus
from tests.support import until

pytestmark = pytest.mark.redis


def result(rid: str, shadow: bool = False) -> InferenceResult:
    return InferenceResult(
        request_id=rid,
        tenant="t",
        status=ResultStatus.OK,
        model="cand" if shadow else "ctrl",
        text="a b c",
        timings=Timings(ttft_ms=5, total_ms=50),
        shadow=shadow,
    )


async def test_handlers_join_publish_and_dead_letter(on_bus: EitherBus) -> None:
    topics = on_bus.topics
    runtime = await on_bus.runtime(contracts.COMPARATOR)
    handlers = build(runtime, ComparatorSettings(decide=False))
    await on_bus.send(topics.name(t.EXPERIMENTS), create("exp", "ctrl", "cand"), key="exp")
    await on_bus.start(runtime)
    assert "exp" in handlers.comparator.experiments.by_id  # followed before results are read
    try:
        await on_bus.send(topics.name(t.RESULTS), result("r1"), key="r1")
        await on_bus.send(topics.name(t.RESULTS), result("r1.shadow.exp", shadow=True), key="r1.shadow.exp")
        await on_bus.send(topics.name(t.RESULTS), b"not json", key="junk")
        [comparison] = await on_bus.published(
            topics.name(t.COMPARISONS), Comparison, until=lambda found: len(found) >= 1
        )
        assert comparison.comparison_id == "t:r1:exp" and comparison.similarity == 1.0
        [letter] = await on_bus.published(topics.name(t.DLQ), DeadLetter, until=lambda found: len(found) >= 1)
        assert letter.error_code == "malformed"
        await on_bus.send(topics.name(t.EXPERIMENTS), None, key="exp")  # tombstone: forgotten
        await until(lambda: "exp" not in handlers.comparator.experiments.by_id, timeout_s=30)
        assert not runtime.contract.undeclared(topics, runtime.publisher.topics_written)
    finally:
        await handlers.comparator.store.drop()
