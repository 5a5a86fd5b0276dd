"""Retraining samples from the real broker: llm.feedback joined with llm.routed and llm.results."""

from __future__ import annotations

import pytest

from llmbus.bus import Bus
from llmbus.contract import topics as t
from llmbus.contract.messages import Feedback, InferenceRequest, InferenceResult, ResultStatus, RoutedRequest
from llmbus.settings import BusSettings
from llmbus_services.router.core.config import load_policy
from llmbus_tools.router_training.feedback import collect_samples

pytestmark = pytest.mark.kafka


async def test_feedback_joined_with_routed_and_results_gives_labelled_samples(bus_settings: BusSettings) -> None:
    bus = await Bus.start(bus_settings, t.CLIENT)
    topics = bus.topics
    try:
        for rid, model, score in [
            ("r-small-good", "qwen2.5-coder-1.5b-instruct", 0.9),
            ("r-mid-bad", "llama-3.3-70b-instruct", 0.1),
            ("r-strong-good", "gpt-4.1", 0.95),
            ("r-no-feedback", "gpt-4.1", None),
        ]:
            req = InferenceRequest(request_id=rid, prompt=f"question {rid}", category="qa")
            await bus.publisher.publish(topics.name(t.ROUTED), RoutedRequest(request=req, model=model), key=model)
            result = InferenceResult(
                request_id=rid, tenant="default", status=ResultStatus.OK, model=model, text="answer"
            )
            await bus.publisher.publish(topics.name(t.RESULTS), result, key=rid)
            if score is not None:
                await bus.publisher.publish(
                    topics.name(t.FEEDBACK), Feedback(request_id=rid, tenant="default", score=score), key=rid
                )
    finally:
        await bus.stop()
    rows = await collect_samples(bus_settings, load_policy(), timeout_s=20)
    assert {(r["id"], r["tier"], r["label"]) for r in rows} == {
        ("r-small-good", "small", "low"),
        ("r-mid-bad", "mid", "high"),
    }
