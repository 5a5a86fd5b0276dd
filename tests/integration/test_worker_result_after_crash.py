"""A worker that dies after its result is written and before it marks it done gets no second result.

Found by `make reliability` (sigkill_each_service, 3000 requests): a worker SIGKILLed between writing
a result and setting its final marker to `done` left the marker `pending:1`. Its restarted process
took the same Dispatch again (never committed), took over its own pending claim and published a
second result; a later attempt placed once the claim's lease lapsed would have done the same.

Here the dead incarnation's steps are done by hand on the real broker and Redis (claim, result
written, no `done`), then `AttemptEnd.publish_final` runs as the next incarnation would. Pass
criterion, fixed before the run: exactly one result of the request on llm.results, the first one;
the final marker `done:<its attempt>`; a `duplicate` outcome for the second run; a scheduler giving
up after the lease lapsed publishes no error over it. Control: when the first incarnation died before
its result was written, the second one's result (or the scheduler's error) is the one answer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from llmbus.bus import Bus
from llmbus.bus.tables import read_log
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Dispatch,
    DispatchOutcome,
    ErrorCode,
    ErrorInfo,
    InferenceRequest,
    InferenceResult,
    OutcomeStatus,
    ResultStatus,
    RoutedRequest,
)
from llmbus.settings import BusSettings
from llmbus.state.fencing import RequestFence, Superseded
from llmbus.state.text import text_of
from llmbus_services.engine_worker.adapters.ending import AttemptEnd
from llmbus_services.router.config import RouterSettings
from llmbus_services.router.flows.requests import ROUTER_ATTEMPT, RequestFlow
from llmbus_services.scheduler.config import SchedulerSettings
from llmbus_services.scheduler.flows import SchedulerHandlers
from tests.support import redis_keys

pytestmark = [pytest.mark.kafka, pytest.mark.redis]
LEASE_S = 1.0


@pytest.fixture
async def bus(bus_settings: BusSettings) -> AsyncIterator[Bus]:
    bus = await Bus.start(bus_settings, t.WORKER)
    yield bus
    await bus.stop()


@pytest.fixture
def fence(client: redis.Redis, bus_settings: BusSettings) -> RequestFence:
    return RequestFence(client, bus_settings.topic_prefix, final_ttl_s=600, claim_lease_s=LEASE_S)


def dispatch_of(request_id: str, attempt: int) -> Dispatch:
    request = InferenceRequest(request_id=request_id, tenant="acme", prompt="hello", max_tokens=4)
    return Dispatch(routed=RoutedRequest(request=request, model="m"), worker_id="w1", attempt=attempt)


def result_of(dispatch: Dispatch, text: str) -> InferenceResult:
    return InferenceResult(
        request_id=dispatch.request_id,
        tenant="acme",
        status=ResultStatus.OK,
        model="m",
        worker_id="w1",
        text=text,
        attempt=dispatch.attempt,
    )


async def died_after_writing(bus: Bus, fence: RequestFence, dispatch: Dispatch) -> None:
    """What the dead incarnation did: claimed, wrote its result, never set `done`."""
    claim = await fence.claim_first(dispatch.request_key, dispatch.attempt, int(time.time() * 1000))
    assert claim.claimed and not claim.after_earlier
    await bus.publisher.publish(bus.topics.name(t.RESULTS), result_of(dispatch, "first"), key=dispatch.request_id)


async def answers(settings: BusSettings, request_id: str) -> tuple[list[InferenceResult], list[DispatchOutcome]]:
    topics = t.Topics(settings.topic_prefix)
    results = [
        r for _, r in await read_log(settings, topics.name(t.RESULTS), InferenceResult) if r.request_id == request_id
    ]
    outcomes = [o for _, o in await read_log(settings, topics.name(t.OUTCOMES), DispatchOutcome)]
    return results, [o for o in outcomes if o.request_id == request_id]


async def test_the_restarted_worker_finds_its_result_out_and_publishes_none(bus: Bus, fence: RequestFence) -> None:
    dispatch = dispatch_of(f"crash-{uuid.uuid4().hex[:8]}", attempt=1)
    await died_after_writing(bus, fence, dispatch)
    # The same Dispatch again, in the restarted process: its own pending claim is still there.
    await AttemptEnd(bus, fence, "w1").publish_final(
        dispatch, result_of(dispatch, "second"), bus.topics.name(t.TOKENS), -1, OutcomeStatus.COMPLETED
    )
    results, outcomes = await answers(bus.settings, dispatch.request_id)
    assert [r.text for r in results] == ["first"], "one result: the one already written"
    assert await fence.holder(dispatch.request_key) == "done:1"
    assert [o.status for o in outcomes] == [OutcomeStatus.DUPLICATE]


async def test_a_later_attempt_after_the_lease_lapsed_finds_the_result_out(bus: Bus, fence: RequestFence) -> None:
    first = dispatch_of(f"lapse-{uuid.uuid4().hex[:8]}", attempt=1)
    await died_after_writing(bus, fence, first)
    await asyncio.sleep(LEASE_S + 0.3)  # the pending claim's lease runs out: the scheduler may place attempt 2
    assert await fence.supersede(first.request_key, 2) == Superseded.FENCED
    second = dispatch_of(first.request_id, attempt=2)
    await AttemptEnd(bus, fence, "w2").publish_final(
        second, result_of(second, "second"), bus.topics.name(t.TOKENS), -1, OutcomeStatus.COMPLETED
    )
    results, outcomes = await answers(bus.settings, first.request_id)
    assert [(r.text, r.attempt) for r in results] == [("first", 1)]
    assert await fence.holder(first.request_key) == "done:1"
    assert [o.status for o in outcomes] == [OutcomeStatus.DUPLICATE]


async def test_control_a_worker_that_died_before_writing_is_answered_by_the_next_run(
    bus: Bus, fence: RequestFence, client: redis.Redis
) -> None:
    dispatch = dispatch_of(f"early-{uuid.uuid4().hex[:8]}", attempt=1)
    claim = await fence.claim_first(dispatch.request_key, 1, int(time.time() * 1000))
    assert claim.claimed  # and then it died: nothing written
    await AttemptEnd(bus, fence, "w1").publish_final(
        dispatch, result_of(dispatch, "second"), bus.topics.name(t.TOKENS), -1, OutcomeStatus.COMPLETED
    )
    results, outcomes = await answers(bus.settings, dispatch.request_id)
    assert [r.text for r in results] == ["second"]
    assert await fence.holder(dispatch.request_key) == "done:1"
    assert [o.status for o in outcomes] == [OutcomeStatus.COMPLETED]
    # Marked done, the claim's time is gone: the final marker is the request's only key.
    keys = await redis_keys(client, f"llmbus:{bus.settings.topic_prefix}:*{dispatch.request_id}*")
    assert [text_of(k).rsplit(":", 1)[-1] for k in keys] == ["final"]


async def test_the_schedulers_final_error_after_a_lapsed_claim_defers_to_a_result_out(
    bus: Bus, fence: RequestFence
) -> None:
    """The scheduler gives up (deadline, max attempts) once the dead attempt's lease has lapsed: its
    error would be a second answer where the result is out, and the only one where it is not."""
    handlers = SchedulerHandlers(bus, SchedulerSettings(), None, None, fence)  # type: ignore[arg-type]
    written = dispatch_of(f"gaveup-{uuid.uuid4().hex[:8]}", attempt=1)
    await died_after_writing(bus, fence, written)
    unwritten = dispatch_of(f"gaveup-{uuid.uuid4().hex[:8]}", attempt=1)
    assert (await fence.claim_first(unwritten.request_key, 1, int(time.time() * 1000))).claimed
    await asyncio.sleep(LEASE_S + 0.3)
    assert not await handlers._claim_for_error(written.request_key)
    assert await fence.holder(written.request_key) == "done:1"
    assert await handlers._claim_for_error(unwritten.request_key)
    assert await fence.holder(unwritten.request_key) == "done:scheduler"


async def test_a_worker_after_a_routers_lapsed_claim_finds_the_routers_answer_out(
    bus: Bus, fence: RequestFence
) -> None:
    """The router refused (or answered from its cache) a copy of the request and died before marking its
    answer done; the worker's attempt comes after the router's claim lapsed: the router's answer stands."""
    dispatch = dispatch_of(f"router-{uuid.uuid4().hex[:8]}", attempt=1)
    flow = RequestFlow(bus, RouterSettings(), core=None, budgets=None, fence=fence)  # type: ignore[arg-type]
    assert await flow._claim_answer(dispatch.request_key)  # as it does before each answer of its own
    refusal = InferenceResult(
        request_id=dispatch.request_id,
        tenant="acme",
        status=ResultStatus.ERROR,
        error=ErrorInfo.of(ErrorCode.RATE_LIMITED, "over its requests limit"),
        attempt=ROUTER_ATTEMPT,
        produced_by="router",
    )
    await bus.publisher.publish(bus.topics.name(t.RESULTS), refusal, key=dispatch.request_id)
    await asyncio.sleep(LEASE_S + 0.3)  # ...and died: its pending claim lapses
    await AttemptEnd(bus, fence, "w1").publish_final(
        dispatch, result_of(dispatch, "second"), bus.topics.name(t.TOKENS), -1, OutcomeStatus.COMPLETED
    )
    results, outcomes = await answers(bus.settings, dispatch.request_id)
    assert [(r.produced_by, r.attempt) for r in results] == [("router", ROUTER_ATTEMPT)]
    assert [o.status for o in outcomes] == [OutcomeStatus.DUPLICATE]
