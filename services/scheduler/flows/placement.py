"""Acting on the core's decisions: a placement claimed, its Dispatch published and acknowledged, or the
request's final error (the part every scheduling flow ends in: llmbus_services.scheduler.flows).

Every PlaceAction is claimed in Redis (PlacementStore) before its Dispatch is published; a
later attempt first fences off the earlier ones (llmbus.state.fencing), and is not sent where one
of them claimed the result, lapsed unmarked, and its result is on llm.results. If the claim or the
publish fails, the placement is rolled back and the request gets a final error; a final
error is published only by whoever claims the request's final marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from opentelemetry import trace

from llmbus.bus import Bus
from llmbus.bus.failures import transient
from llmbus.bus.replies import publish_error, reply_topic_of
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Dispatch,
    ErrorCode,
    ErrorInfo,
    RoutedRequest,
    now_ms,
)
from llmbus.contract.request_key import RequestKey
from llmbus.domain.fallback import fall_back
from llmbus.state.fencing import RequestFence, Superseded
from llmbus_services.scheduler.adapters.answers import lapsed_result_marked
from llmbus_services.scheduler.adapters.pool_stats import PoolStatsRecorder
from llmbus_services.scheduler.adapters.store import PlacementStore
from llmbus_services.scheduler.config import SchedulerSettings
from llmbus_services.scheduler.core.scheduler import Action, FinalError, PlaceAction, SchedulerCore
from llmbus_services.scheduler.core.types import Placement, SchedRequest

log = logging.getLogger(__name__)
FINALS_AT_ONCE = 256  # final errors being published at once (Redis round trips and Kafka acks)
# A placement whose claim or Dispatch failed transiently (llmbus.state.errors: Redis out of memory or
# read-only for a while, the broker away) is tried again this much later, its record held open; the
# request's own deadline and queue wait still bound it.
RETRY_PLACE_MS = 1000


class PlacementFlow:
    def __init__(
        self, bus: Bus, settings: SchedulerSettings, core: SchedulerCore, store: PlacementStore, fence: RequestFence
    ) -> None:
        self.bus = bus
        self.fence = fence  # who may publish a request's result; which attempts are superseded
        self.settings = settings
        self.core = core
        self.store = store
        self._answered: dict[RequestKey, asyncio.Future[None]] = {}  # request → set when placed or answered
        self._source: dict[RequestKey, TopicPartition] = {}  # request → llm.routed partition of its open record
        self._spans: dict[RequestKey, trace.Span] = {}  # request → the span of its llm.routed record, until answered
        self._lock = asyncio.Lock()  # core calls and their publishes, one event at a time
        self._restored: set[RequestKey] = set()  # placements loaded from Redis whose Dispatch may never have gone out
        self._delivering: set[RequestKey] = set()  # requests whose Dispatch awaits its ack (`_deliver`)
        self._answering: set[RequestKey] = set()  # requests whose final error is on its way (`_final_errors`)
        self._finals_in_flight = asyncio.Semaphore(FINALS_AT_ONCE)
        self._later: set[asyncio.Task[None]] = set()  # final errors waiting for a lease; acks being confirmed
        # A fleet record written before this process started (the runtime's `replayed`).
        self.replayed: Callable[[ConsumerRecord], bool] = lambda record: False
        self.pool_stats = PoolStatsRecorder(
            settings.instance_id,
            settings.pool_stats_forget_after_s,
            settings.pool_stats_max_unknown_pools,
            settings.pool_stats_latency_window_s,
        )  # the autoscaler's signals

    async def restore(self) -> int:
        placements = await self.store.load(self.settings.prefix_block_tokens, self.settings.max_prefix_blocks)
        self.core.fleet.restore(placements)
        self._restored = {p.request_key for p in placements}
        return len(placements)

    # -- publishing ---------------------------------------------------------------------------
    # Decisions are made one event at a time under the lock: the core's calls, the fencing of later
    # attempts and final errors. A first attempt's placement is handed to a task of its own
    # (`_deliver`) that claims it in Redis and sends its Dispatch outside the lock, so the next events
    # are decided meanwhile: the claims of placements decided close together share one Redis round
    # trip (RedisBatcher) and their Dispatches one produce request. What that leaves open, and why it
    # is safe:
    # - until its claim and Dispatch are through, a placement is counted on its worker (less free
    #   capacity: conservative); a claim another instance won, a claim that failed or a Dispatch that
    #   failed is rolled back under the lock later (a lost claim is forgotten, nothing is answered: the
    #   winner places it);
    # - no other instance can place the attempt meanwhile without one of the two claims failing, and
    #   the llm.routed record stays uncommitted until then, so a crash redelivers it;
    # - a later attempt (the worker declared dead) fences this one off before it is sent; should this
    #   one's Dispatch still go out after that, its worker finds it superseded and runs nothing;
    # - a Dispatch reported failed but written (ack lost) runs on its worker as before: the final
    #   marker lets one of the worker's result and the rollback's error out, never both;
    # - the order of Dispatch records is not relied on: attempts of one request are fenced by number;
    # - the llm.routed record of a request is resolved (and so may be committed) only after its
    #   Dispatch's ack or its rollback, as before, so a crash in between still redelivers it.
    async def _publish(self, actions: list[Action]) -> None:
        """Act on every action (call under the lock); one that fails does not stop the others (the first
        error is raised after). A placement's Dispatch is left on its way (`_deliver`), and so is a final
        error (`_final_errors`)."""
        failed: list[Exception] = []
        finals: list[FinalError] = []
        for action in actions:
            if isinstance(action, FinalError):
                finals.append(action)
                continue
            span = self._spans.get(action.request.key, trace.get_current_span())
            on_its_way = False
            try:
                with trace.use_span(span, end_on_exit=False):
                    if isinstance(action, PlaceAction):
                        try:
                            on_its_way = await self._dispatch(action)
                        except Exception as exc:  # rolled back: placed again later, or its final error
                            if transient(exc):  # its record stays open until it is placed or answered
                                log.warning("could not place %s (%r): again later", action.placement.key, exc)
                                self.core.delay(action.request, now_ms() + RETRY_PLACE_MS)
                                on_its_way = True
                            else:
                                log.exception("could not place %s", action.placement.key)
                                await self._fail(FinalError(action.request, internal_error(exc)))
            except Exception as exc:  # noqa: BLE001 - collected, raised once the other actions are out
                failed.append(exc)
            finally:
                if not on_its_way:  # else resolved by `_deliver` once acknowledged or rolled back
                    self._resolve(action.request.key)
        self._final_errors(finals)
        if failed:
            raise failed[0]

    def _final_errors(self, finals: list[FinalError]) -> None:
        """Each final error published by a task of its own, outside the lock; its request is resolved
        once the error is out (or with the exception that stopped it: its record's handler raises it).

        Awaited under the lock, each error held it for its Redis round trips and its Kafka ack, ~250 ms
        after a leader failover (the 3-broker `leader_sigkill` scenario): a tick that expired a full
        queue held it for minutes, and once the queue was full every new request's `queue_full` took
        its turn too, more lock time a second than a second has, while heartbeats, outcomes and
        placements waited. No final error touches the core; FINALS_AT_ONCE bounds those in flight."""
        for action in finals:
            self._answering.add(action.request.key)
            self._keep(asyncio.create_task(self._final_error(action)))

    async def _final_error(self, action: FinalError) -> None:
        key = action.request.key
        span = self._spans.get(key, trace.get_current_span())
        try:
            async with self._finals_in_flight:
                with trace.use_span(span, end_on_exit=False):
                    if not await self._placed_again(action):
                        await self._fail(action)
        except Exception as exc:  # its record's handler raises it (DLQ, answer)
            log.warning("final error of %s not published", key, exc_info=True)
            self._answering.discard(key)
            self._resolve(key, exc)
        else:
            self._answering.discard(key)
            self._resolve(key)

    async def _placed_again(self, action: FinalError) -> bool:
        """True when the request was placed again instead of answered with `action`'s error (OutcomeFlow)."""
        return False

    async def _deliver(self, action: PlaceAction, routed: RoutedRequest, claim: bool) -> None:
        """The placement claimed (when `claim`), its Dispatch sent and acknowledged, outside the lock;
        if either fails, rolled back under it."""
        placement = action.placement
        try:
            await self._deliver_or_roll_back(action, routed, claim)
        finally:
            self._delivering.discard(placement.request_key)

    async def _deliver_or_roll_back(self, action: PlaceAction, routed: RoutedRequest, claim: bool) -> None:
        placement = action.placement
        try:
            if claim and not await self.store.claim(placement):
                async with self._lock:  # another instance placed this attempt first: count nothing here
                    self.core.forget(placement.request_key, placement.attempt)
                self._resolve(placement.request_key)
                return
            await self._send(placement.worker_id, routed, placement.attempt, action.request)
        except Exception as exc:
            if transient(exc):  # Redis refusing writes for a while, Kafka away: placed again, not answered
                log.warning("could not place %s (%r): placing it again in %d ms", placement.key, exc, RETRY_PLACE_MS)
                async with self._lock:
                    await self._roll_back(placement)
                    self.core.delay(action.request, now_ms() + RETRY_PLACE_MS)
                return  # its record stays open until the request is placed or answered
            log.exception("could not place %s", placement.key)
            try:
                async with self._lock:
                    await self._roll_back(placement)
                    await self._fail(FinalError(action.request, internal_error(exc)))
            except Exception as fail_exc:  # noqa: BLE001 - its record's handler raises it (DLQ, answer)
                self._resolve(placement.request_key, fail_exc)
                return
        else:
            self.pool_stats.on_placed(placement, routed.routed_at_ms, now_ms())
            # Debug, not info: one line per request is a write per request (the result records where it ran).
            log.debug("placed %s attempt %d on %s", placement.request_id, placement.attempt, placement.worker_id)
        self._resolve(placement.request_key)

    async def _roll_back(self, placement: Placement) -> None:
        """No phantom placement stays counted, and the request id is not "held" any more."""
        self.core.forget(placement.request_key, placement.attempt)
        with contextlib.suppress(Exception):
            await self.store.release_own(placement.request_key, placement.attempt)

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._later.add(task)
        task.add_done_callback(self._later.discard)

    async def _dispatch(self, action: PlaceAction) -> bool:
        """Start the placement's claim and Dispatch (`_deliver`); False when nothing is sent.

        A later attempt is fenced and claimed here, under the lock (it must fence off the earlier
        ones before anything else is decided about the request); a first attempt is claimed by its
        `_deliver` task, outside it."""
        placement = action.placement
        request = placement.request
        if request.routed is None:
            self.core.forget(placement.request_key, placement.attempt)
            return False
        if placement.attempt > 1:
            try:
                if not await self._supersede(action):
                    return False
                if not await self.store.claim(placement):
                    # Another instance placed this attempt first: count nothing here.
                    self.core.forget(placement.request_key, placement.attempt)
                    return False
                await self.store.release_own(placement.request_key, placement.attempt - 1)
            except Exception:
                await self._roll_back(placement)
                raise
        self._delivering.add(placement.request_key)
        self._keep(asyncio.create_task(self._deliver(action, request.routed, claim=placement.attempt == 1)))
        return True

    async def _supersede(self, action: PlaceAction) -> bool:
        """Fence off the earlier attempts before sending this one; False when it must not go out now."""
        placement = action.placement
        key, attempt = placement.request_key, placement.attempt
        verdict = await self.fence.supersede(key, attempt)
        if verdict == Superseded.LAPSED:
            # An earlier claim lapsed unmarked (its claimant died or stalled mid-publish): its result may be
            # out. Looked up under the lock, a Kafka read of up to admin_timeout_s, as it is rare; a look-up
            # that fails raises (placed again later, `_publish`): never sent blind.
            if await lapsed_result_marked(self.bus, self.fence, key):
                verdict = Superseded.RESULT_OUT
            else:
                verdict = await self.fence.supersede(key, attempt, looked_up=True)
        if verdict == Superseded.FENCED:
            return True
        self.core.forget(placement.request_key, placement.attempt)
        if verdict == Superseded.RESULT_PENDING:
            # An earlier attempt is publishing its result (or died doing so): ask again after its lease.
            self.core.delay(placement.request, now_ms() + self.fence.claim_lease_ms)
        else:
            log.info("%s: an earlier attempt's result is out; attempt %s not sent", *placement.key.rsplit(":", 1))
        return False

    async def _send(self, worker_id: str, routed: RoutedRequest, attempt: int, request: SchedRequest) -> None:
        view = self.core.fleet.workers.get(worker_id)
        topic = (view.dispatch_topic if view is not None and view.dispatch_topic else None) or self.bus.topics.dispatch(
            worker_id
        )
        dispatch = Dispatch(
            routed=routed,
            worker_id=worker_id,
            attempt=attempt,
            prefix_block_hashes=request.prefix_block_hashes,
            earlier=request.earlier,
        )
        # Through a broker restart: a failed send would turn into the request's final error.
        await self.bus.publisher.publish(
            topic,
            dispatch,
            key=routed.request_id,
            request_id=routed.request_id,
            tenant=routed.request.tenant,
            retry_for_s=self.bus.settings.publish_retry_s,
        )

    async def _fail(self, action: FinalError) -> None:
        request = action.request
        try:
            await self.store.release_own(request.key, request.attempt)
        except Exception:  # the claim expires by itself; the answer matters more
            log.warning("could not release the claim of %s", request.request_id, exc_info=True)
        routed = request.routed
        if routed is None:
            return
        code = action.error.code
        # For a prompt over this model's window, the next model is the next whose window fits.
        fits = (lambda model: self.core.fits_model(request, model)) if code == ErrorCode.PROMPT_TOO_LONG else None
        specs = self.core.model_specs
        if (rerouted := fall_back(routed, routed.model, code, fits, attempts=request.attempt, specs=specs)) is not None:
            if not await self.fence.restart(request.key):
                return  # an earlier attempt's result is out after all
            # This model can't take it, the router gave a chain: the next model gets it.
            log.info("%s: %s", request.request_id, rerouted.route_reason)
            await self.bus.publisher.publish(
                self.bus.topics.name(t.ROUTED),
                rerouted,
                key=rerouted.model,
                request_id=request.request_id,
                tenant=request.tenant,
            )
            return
        if not await self._claim_for_error(request.key):
            if await self._result_pending(request.key):
                # An attempt claimed the result and has not marked it out: it is publishing (its claim
                # renewed meanwhile) or died doing so. Ask again once its lease can have run out, or
                # the request would end with no answer at all.
                self._fail_later(action)
                return
            log.info("%s: its result is out already; no %s error", request.request_id, action.error.code.value)
            return
        log.info("final error for %s: %s", request.request_id, action.error.code.value)
        await publish_error(
            self.bus.publisher,
            self.bus.topics,
            request_id=request.request_id,
            tenant=request.tenant,
            error=action.error,
            produced_by=self.bus.service,
            reply_topic=reply_topic_of(self.bus.topics, routed.request.reply_topic),
            model=routed.model,
            shadow=routed.shadow,
            attempt=request.attempt + 1 if action.ran else request.attempt,
            experiment_id=routed.experiment_id,
            variant=routed.variant,
            **routed.facts(),
        )

    async def _result_pending(self, key: RequestKey) -> bool:
        try:
            holder = await self.fence.holder(key)
        except Exception:  # Redis away: the claim attempt above said what it could
            log.warning("final marker of %s unreadable", key, exc_info=True)
            return False
        return holder is not None and holder.startswith("pending:")

    def _fail_later(self, action: FinalError) -> None:
        async def again() -> None:
            await asyncio.sleep(self.fence.claim_lease_ms / 1000)
            async with self._lock:
                await self._fail(action)

        log.info(
            "%s: an attempt holds a pending claim; its %s error waits",
            action.request.request_id,
            action.error.code.value,
        )
        task = asyncio.create_task(again())
        self._later.add(task)
        task.add_done_callback(self._later.discard)

    async def _claim_for_error(self, key: RequestKey) -> bool:
        try:
            # If a lapsed claim's result is out, that is the answer (marked now), not this error.
            return not await lapsed_result_marked(self.bus, self.fence, key) and await self.fence.claim_for_error(key)
        except Exception:  # better a (rare) second answer than none: no worker can claim either
            log.warning("final marker of %s unreachable; publishing its error anyway", key, exc_info=True)
            return True

    def _resolve(self, key: RequestKey, error: Exception | None = None) -> None:
        self._spans.pop(key, None)
        future = self._answered.pop(key, None)
        if future is not None and not future.done():
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)


def internal_error(exc: BaseException) -> ErrorInfo:
    """The final error of a request the scheduler failed to place (Redis or Kafka trouble): resend it
    under a new request id."""
    return ErrorInfo(
        code=ErrorCode.INTERNAL,
        message=f"could not place the request: {type(exc).__name__}: {exc}"[:2000],
        retryable=True,
        retry_after_ms=1000,
    )
