"""A refused copy of a request id is not a second result (the final marker on the real Redis).

A tenant sent a real request and a second one under the same id that the router refuses (a
forbidden reply topic, a foreign tenant in the body): the refusal was published without claiming
the final marker, so the id had two results and cost-accounting billed the refusal ($0) and
dropped the real one.
"""

from __future__ import annotations

import pytest
import redis.asyncio as redis
from aiokafka.structs import ConsumerRecord

from llmbus.contract.messages import ErrorCode, InferenceRequest, InferenceResult, ResultStatus
from llmbus.state.fencing import RequestFence
from llmbus_services.router.flows import RouterHandlers
from tests.unit.test_router_answers_once import router
from tests.unit.test_worker_request_errors import RecordingPublisher

pytestmark = pytest.mark.redis


def record_of(request: InferenceRequest) -> ConsumerRecord:
    raw = request.to_bytes()
    return ConsumerRecord("x.llm.requests", 0, 0, 0, 0, request.request_id.encode(), raw, None, 2, len(raw), [])


def refused_copy(request_id: str) -> ConsumerRecord:
    """Refused by the router: its reply topic is internal."""
    return record_of(InferenceRequest(request_id=request_id, prompt="hi", max_tokens=4, reply_topic="llm.routed"))


def router_on(fence: RequestFence) -> tuple[RouterHandlers, RecordingPublisher]:
    handlers, publisher = router(fence)  # type: ignore[arg-type]
    handlers.bus.send_dead_letter = _dead_letter  # type: ignore[method-assign]
    return handlers, publisher


async def _dead_letter(*_: object) -> bool:
    return True


@pytest.fixture
def fence(client: redis.Redis, namespace: str) -> RequestFence:
    return RequestFence(client, namespace, final_ttl_s=600, claim_lease_s=5)


async def test_a_refused_copy_after_the_worker_answered_publishes_no_second_result(fence: RequestFence) -> None:
    handlers, publisher = router_on(fence)
    assert await fence.claim_final("default:r-1", 1)  # the real request, routed, answered by attempt 1
    await fence.final_published("default:r-1", 1)
    await handlers.on_request(refused_copy("r-1"))
    assert publisher.of(InferenceResult) == []
    assert await fence.holder("default:r-1") == "done:1"


async def test_a_refused_copy_that_comes_first_is_the_only_result(fence: RequestFence) -> None:
    handlers, publisher = router_on(fence)
    await handlers.on_request(refused_copy("r-2"))
    [refusal] = publisher.of(InferenceResult)
    assert refusal.status == ResultStatus.ERROR and refusal.error is not None
    assert refusal.error.code == ErrorCode.FORBIDDEN
    assert await fence.holder("default:r-2") == "done:0"
    assert not await fence.claim_final("default:r-2", 1), "the real request's worker attempt may not publish a second"
    assert await fence.superseded("default:r-2", 1), "and it stops before it runs"
