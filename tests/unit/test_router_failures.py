"""A router handler that fails (e.g. Redis down under the limits) still answers the client (issue 9, defect 5)."""

from __future__ import annotations

import pytest
from aiokafka.structs import ConsumerRecord

from llmbus.contract.messages import ErrorCode, InferenceRequest, InferenceResult, TokenChunk
from llmbus_services.router.config import RouterSettings
from llmbus_services.router.core.complexity import build_scorer
from llmbus_services.router.core.config import load_policy
from llmbus_services.router.core.pipeline import RouteOutcome, RouterCore
from llmbus_services.router.flows import RouterHandlers
from tests.unit.test_worker_request_errors import FakeBus, RecordingPublisher


class EveryTopicExists:
    async def exists(self, topic: str) -> bool:
        return True


class UnreachableRedisCore(RouterCore):
    def __init__(self) -> None:
        super().__init__(load_policy(), build_scorer("heuristic"))

    async def route(self, request: InferenceRequest, received_at_ms: int | None = None) -> RouteOutcome:
        raise ConnectionError("redis: connection refused")


async def test_a_failing_route_answers_the_client_then_goes_to_the_dlq() -> None:
    publisher = RecordingPublisher()
    handlers = RouterHandlers(
        FakeBus(publisher),  # type: ignore[arg-type]
        RouterSettings(),
        UnreachableRedisCore(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        directory=EveryTopicExists(),
    )
    raw = InferenceRequest(request_id="r1", prompt="hi", max_tokens=4, reply_topic="llm.replies.acme").to_bytes()
    record = ConsumerRecord("x.llm.requests", 0, 0, 0, 0, b"r1", raw, None, 2, len(raw), [])
    with pytest.raises(ConnectionError):  # raised on: the ConsumerLoop writes the DLQ entry
        await handlers.on_request(record)
    [result] = publisher.of(InferenceResult)
    assert result.request_id == "r1" and result.error is not None
    assert result.error.code == ErrorCode.INTERNAL and result.error.retryable
    [(topic, chunk)] = [(t, v) for t, v in publisher.sent if isinstance(v, TokenChunk)]
    assert topic == "x.llm.replies.acme" and chunk.final
