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
from dataclasses import dataclass, field

import pytest
import redis.asyncio as redis
from aiokafka.structs import ConsumerRecord

from llmbus.bus import Bus
from llmbus.bus.catch_up import NotReadToEnd
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
    WorkerState,
    now_ms,
)
from llmbus.settings import BusSettings
from llmbus.state.fencing import RequestFence, Superseded
from llmbus.state.text import text_of
from llmbus_services.engine_worker.adapters.ending import AttemptEnd
from llmbus_services.router.config import RouterSettings
from llmbus_services.router.flows.requests import ROUTER_ATTEMPT, RequestFlow
from llmbus_services.scheduler.adapters import answers as answer_lookups
from llmbus_services.scheduler.adapters.store import PlacementStore
from llmbus_services.scheduler.app import build_core
from llmbus_services.scheduler.config import SchedulerSettings
from llmbus_services.scheduler.flows import SchedulerHandlers
from llmbus_services.scheduler.flows.placement import RETRY_PLACE_MS
from tests.integration.test_scheduler_handler_faults import heartbeat
from tests.support import redis_keys, until

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
    assert await fence.supersede(first.request_key, 2) == Superseded.LAPSED
    # As if the scheduler's look-up had missed the result (written after its read): the worker's finds it.
    assert await fence.supersede(first.request_key, 2, looked_up=True) == Superseded.FENCED
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


@dataclass
class Recorded:
    sent: list[object] = field(default_factory=list)

    async def publish(self, topic: str, value: object, **_: object) -> None:
        self.sent.append(value)

    def of(self, kind: type) -> list:  # type: ignore[type-arg]
        return [v for v in self.sent if isinstance(v, kind)]


@dataclass
class SchedulerBus:
    """The scheduler's bus on the real broker's namespace (llm.results is read for real); what it
    publishes (Dispatches, errors) is recorded instead."""

    settings: BusSettings
    topics: t.Topics
    publisher: Recorded = field(default_factory=Recorded)
    service: str = t.SCHEDULER


async def scheduler_of(bus_settings: BusSettings, fence: RequestFence, client: redis.Redis) -> SchedulerHandlers:
    settings = SchedulerSettings(instance_id="s1", heartbeat_stale_s=60)
    handlers = SchedulerHandlers(
        SchedulerBus(bus_settings, t.Topics(bus_settings.topic_prefix)),  # type: ignore[arg-type]
        settings,
        build_core(settings),
        PlacementStore(client, f"{bus_settings.topic_prefix}scheduler", "s1", ttl_s=600),
        fence,
    )
    for worker_id in ("w1", "w2"):
        await heartbeat(handlers, worker_id, WorkerState.READY)
    return handlers


async def first_attempt_lapsed(
    bus: Bus, handlers: SchedulerHandlers, fence: RequestFence, request_id: str, written: bool
) -> Dispatch:
    """Attempt 1 placed; its worker claims the result, writes it (when `written`) and is SIGKILLed before
    `done`; its claim's lease lapses. Returns attempt 1's Dispatch."""
    routed = dispatch_of(request_id, attempt=1).routed
    raw = routed.to_bytes()
    record = ConsumerRecord(bus.topics.name(t.ROUTED), 0, 0, 0, 0, b"m", raw, None, 1, len(raw), [])
    await asyncio.wait_for(handlers.on_routed(record), 10)
    [first] = sent(handlers).of(Dispatch)
    if written:
        await died_after_writing(bus, fence, first)
    else:
        assert (await fence.claim_first(first.request_key, 1, int(time.time() * 1000))).claimed
    await asyncio.sleep(LEASE_S + 0.3)
    assert await fence.holder(first.request_key) is None and await fence.lapsed_claim_ms(first.request_key)
    return first


def sent(handlers: SchedulerHandlers) -> Recorded:
    return handlers.bus.publisher  # type: ignore[return-value]


async def test_a_later_attempt_is_not_placed_over_a_lapsed_claims_result(
    bus: Bus, fence: RequestFence, client: redis.Redis, bus_settings: BusSettings
) -> None:
    """The worker died after writing its result, before `done`; once its lease lapsed the scheduler declares
    it lost: attempt 2 would have been sent (its worker, if its look-up timed out, streams the answer again
    after the result). The result is found on llm.results instead, marked done, and nothing is sent."""
    handlers = await scheduler_of(bus_settings, fence, client)
    first = await first_attempt_lapsed(bus, handlers, fence, f"lapsed-{uuid.uuid4().hex[:8]}", written=True)
    await heartbeat(handlers, first.worker_id, WorkerState.STOPPED)  # lost: the core places attempt 2
    assert not handlers._delivering
    assert [d.attempt for d in sent(handlers).of(Dispatch)] == [1], "no attempt 2"
    assert sent(handlers).of(InferenceResult) == [], "and no error over the result"
    assert await fence.holder(first.request_key) == "done:1"
    assert await client.get(fence._keys(first.request_key)[1]) is None, "nothing fenced"
    assert handlers.core.fleet.placement_of(first.request_key) is None and not handlers.core.delayed
    results, _ = await answers(bus.settings, first.request_id)
    assert [(r.text, r.attempt) for r in results] == [("first", 1)]


async def test_control_a_lapsed_claim_with_no_result_out_gets_its_later_attempt(
    bus: Bus, fence: RequestFence, client: redis.Redis, bus_settings: BusSettings
) -> None:
    handlers = await scheduler_of(bus_settings, fence, client)
    first = await first_attempt_lapsed(bus, handlers, fence, f"unwritten-{uuid.uuid4().hex[:8]}", written=False)
    await heartbeat(handlers, first.worker_id, WorkerState.STOPPED)
    await until(lambda: len(sent(handlers).of(Dispatch)) == 2)
    assert [d.attempt for d in sent(handlers).of(Dispatch)] == [1, 2]
    assert await fence.superseded(first.request_key, 1) and not await fence.superseded(first.request_key, 2)
    assert await fence.holder(first.request_key) is None
    assert sent(handlers).of(InferenceResult) == []


async def test_a_lapsed_claims_look_up_that_fails_puts_the_placement_off_not_sent_blind(
    bus: Bus, fence: RequestFence, client: redis.Redis, bus_settings: BusSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llm.results not read to its end (a loaded broker): attempt 2 is neither sent nor answered; it is
    placed again RETRY_PLACE_MS later, when the look-up answers."""
    handlers = await scheduler_of(bus_settings, fence, client)
    first = await first_attempt_lapsed(bus, handlers, fence, f"lookup-{uuid.uuid4().hex[:8]}", written=True)
    real = answer_lookups.result_out_since
    looked: list[bool] = []

    async def times_out_once(*args: object, **kwargs: object) -> int | None:
        if not looked:
            looked.append(False)
            raise NotReadToEnd(set(), 10)
        looked.append(True)
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(answer_lookups, "result_out_since", times_out_once)
    await heartbeat(handlers, first.worker_id, WorkerState.STOPPED)
    assert first.request_key in handlers.core.delayed, "put off"
    assert [d.attempt for d in sent(handlers).of(Dispatch)] == [1] and sent(handlers).of(InferenceResult) == []
    assert await fence.holder(first.request_key) is None and not await fence.superseded(first.request_key, 1)
    async with handlers._lock:
        await handlers._publish(handlers.core.tick(now_ms() + RETRY_PLACE_MS))
    assert looked == [False, True]
    assert [d.attempt for d in sent(handlers).of(Dispatch)] == [1] and sent(handlers).of(InferenceResult) == []
    assert await fence.holder(first.request_key) == "done:1"
