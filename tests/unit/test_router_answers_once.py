"""One result per request id when the router answers itself (cache hit, refusal, bad input) and a
reply topic that refuses the final chunk never keeps the result off llm.results (issue 9).

A request record delivered a second time (the router was killed before committing) used to be
answered from the cache although its first delivery had been routed and answered by a worker.
"""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from llmbus.bus.replies import publish_result
from llmbus.contract.messages import (
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    RoutedRequest,
    TokenChunk,
)
from llmbus.contract.topics import Topics
from llmbus_services.router.config import RouterSettings
from llmbus_services.router.core.pipeline import RouteOutcome
from llmbus_services.router.flows import RouterHandlers
from tests.unit.test_worker_request_errors import FakeBus, MemoryFence, RecordingPublisher


class EveryTopicExists:
    """The router's topic directory on a bus where every reply topic exists."""

    async def exists(self, topic: str) -> bool:
        return True


class CacheHitCore:
    async def route(self, request: InferenceRequest, received_at_ms: int) -> RouteOutcome:
        result = InferenceResult(
            request_id=request.request_id, tenant=request.tenant, status=ResultStatus.OK, text="cached", cached=True
        )
        chunk = TokenChunk(request_id=request.request_id, tenant=request.tenant, seq=0, delta="cached")
        return RouteOutcome(result=result, content_chunks=[chunk])

    def request_facts(self, request: InferenceRequest, route_reason: str | None = None) -> dict[str, object]:
        return RoutedRequest(request=request, model="").facts(route_reason)  # as RouterCore's, without a policy


def request_record(request_id: str = "r1") -> ConsumerRecord:
    raw = InferenceRequest(request_id=request_id, prompt="hi", max_tokens=4).to_bytes()
    return ConsumerRecord("x.llm.requests", 0, 0, 0, 0, request_id.encode(), raw, None, 2, len(raw), [])


def router(fence: MemoryFence) -> tuple[RouterHandlers, RecordingPublisher]:
    publisher = RecordingPublisher()
    handlers = RouterHandlers(
        FakeBus(publisher),  # type: ignore[arg-type]
        RouterSettings(),
        CacheHitCore(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        fence=fence,
        directory=EveryTopicExists(),
    )
    return handlers, publisher


async def test_a_redelivered_request_already_answered_by_a_worker_is_not_answered_from_the_cache() -> None:
    fence = MemoryFence()
    fence.final["default:r1"] = "done:1"  # the first delivery was routed; attempt 1 published the result
    handlers, publisher = router(fence)
    await handlers.on_request(request_record())
    assert publisher.sent == []


async def test_a_cache_hit_claims_the_final_marker_so_a_running_attempt_publishes_none() -> None:
    fence = MemoryFence()
    handlers, publisher = router(fence)
    await handlers.on_request(request_record())
    [result] = publisher.of(InferenceResult)
    assert result.cached and fence.final["default:r1"] == "done:0"
    assert not await fence.claim_final("default:r1", 1)  # a worker attempt of an earlier delivery is refused
    await handlers.on_request(request_record())  # delivered once more: no second answer
    assert len(publisher.of(InferenceResult)) == 1


async def test_a_bad_request_redelivered_gets_one_error_result() -> None:
    handlers, publisher = router(MemoryFence())
    raw = b'{"request_id": "r9", "prompt": 5}'
    record = ConsumerRecord("x.llm.requests", 0, 0, 0, 0, b"r9", raw, None, 2, len(raw), [])
    handlers.bus.send_dead_letter = _no_dead_letter  # type: ignore[attr-defined]
    await handlers.on_request(record)
    await handlers.on_request(record)
    assert len(publisher.of(InferenceResult)) == 1


async def _no_dead_letter(*_: object) -> None:
    return None


class RefusingReplyTopic(RecordingPublisher):
    async def publish(self, topic: str, value: object, **kw: object) -> None:
        if topic.endswith("llm.replies.gone"):
            raise TimeoutError("no such topic")
        await super().publish(topic, value, **kw)


async def test_a_reply_topic_that_refuses_the_final_chunk_does_not_keep_the_result_back() -> None:
    publisher = RefusingReplyTopic()
    topics = Topics("x.")
    result = InferenceResult(request_id="r2", tenant="t", status=ResultStatus.OK, text="hi")
    await publish_result(publisher, topics, result, "x.llm.replies.gone", last_seq=3)  # type: ignore[arg-type]
    assert publisher.sent == [("x.llm.results", result)]


async def test_the_result_goes_first_then_the_chunks_with_the_final_one_after_the_content() -> None:
    publisher = RecordingPublisher()
    result = InferenceResult(request_id="r3", tenant="t", status=ResultStatus.OK, text="ab")
    content = [TokenChunk(request_id="r3", tenant="t", seq=0, delta="ab")]
    await publish_result(publisher, Topics("x."), result, "x.llm.replies", content_chunks=content)  # type: ignore[arg-type]
    topics = [topic for topic, _ in publisher.sent]
    assert topics == ["x.llm.results", "x.llm.replies", "x.llm.replies"]
    final = publisher.sent[-1][1]
    assert isinstance(final, TokenChunk) and final.final and final.seq == 1


async def test_the_routers_answer_carries_the_attempt_it_claimed_the_final_marker_with() -> None:
    fence = MemoryFence()
    handlers, publisher = router(fence)
    await handlers.on_request(request_record())
    assert fence.final["default:r1"] == "done:0"  # the router's claim: attempt 0, below every worker attempt
    [result] = publisher.of(InferenceResult)
    chunks = publisher.of(TokenChunk)
    assert [c.final for c in chunks] == [False, True]  # the cached text, then the final chunk
    assert {result.attempt, *(c.attempt for c in chunks)} == {0}


async def test_the_routers_error_answers_carry_its_attempt_too() -> None:
    handlers, publisher = router(MemoryFence())
    raw = b'{"request_id": "r8", "prompt": 5}'
    record = ConsumerRecord("x.llm.requests", 0, 0, 0, 0, b"r8", raw, None, 2, len(raw), [])
    handlers.bus.send_dead_letter = _no_dead_letter  # type: ignore[attr-defined]
    await handlers.on_request(record)
    [result] = publisher.of(InferenceResult)
    assert result.status == ResultStatus.ERROR
    assert {result.attempt, *(c.attempt for c in publisher.of(TokenChunk))} == {0}
