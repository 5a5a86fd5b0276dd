"""The router's own wiring (app.build) in memory and on the real broker: a request routed, a record that
does not decode dead-lettered and answered with a final error, the followed state applied."""

from __future__ import annotations

import pytest

from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    DeadLetter,
    ErrorCode,
    InferenceRequest,
    InferenceResult,
    ModelSpec,
    RoutedRequest,
)
from llmbus_services.router.app import build
from llmbus_services.router.config import RouterSettings
from tests.fixtures.buses import EitherBus

pytestmark = pytest.mark.redis


async def test_a_request_is_routed_and_bad_input_is_answered_and_dead_lettered(on_bus: EitherBus) -> None:
    topics = on_bus.topics
    runtime = await on_bus.runtime(contracts.ROUTER)
    handlers = build(runtime, RouterSettings(default_model="sim-llama-8b"))
    await on_bus.send(topics.name(t.MODELS), ModelSpec(name="sim-llama-8b", max_model_len=4096), key="sim-llama-8b")
    await on_bus.start(runtime)
    assert handlers.core.catalog.knows("sim-llama-8b")  # the followed state is applied before it serves

    await on_bus.send(topics.name(t.REQUESTS), InferenceRequest(request_id="r1", prompt="hi", max_tokens=8), key="r1")
    [routed] = await on_bus.published(topics.name(t.ROUTED), RoutedRequest, until=lambda found: len(found) >= 1)
    assert routed.request_id == "r1" and routed.model == "sim-llama-8b" and not routed.shadow

    await on_bus.send(topics.name(t.REQUESTS), b'{"request_id": "r2", "max_tokens": "many"}', key="r2")
    [letter] = await on_bus.published(topics.name(t.DLQ), DeadLetter, until=lambda found: len(found) >= 1)
    assert letter.request_id == "r2" and letter.error_code == ErrorCode.INVALID_REQUEST
    results = await on_bus.published(
        topics.name(t.RESULTS), InferenceResult, until=lambda found: any(r.request_id == "r2" for r in found)
    )
    [answer] = [r for r in results if r.request_id == "r2"]
    assert answer.error is not None and answer.error.code == ErrorCode.INVALID_REQUEST and answer.attempt == 0
    assert not runtime.contract.undeclared(topics, runtime.publisher.topics_written)
