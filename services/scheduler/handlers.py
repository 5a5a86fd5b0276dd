"""Scheduler handlers (thin): decode → SchedulerCore → publish its actions.

- llm.routed → `submit`; a request that must wait keeps its handler (and so its offset)
  open until it is placed or answered, so a crash never loses a queued request. When the
  partition is revoked (a rebalance), what still waits here is handed over: dropped from
  the core and its handler cancelled, uncommitted, so the new owner reads it again.
- llm.workers / llm.nodes / llm.models → the fleet view; llm.control cancels a queued request.
- llm.outcomes → release the placement, retry or give up.
- a timer → deadlines of queued requests, delayed retries and dead workers.
Every PlaceAction is claimed in Redis (PlacementStore) before its Dispatch is published; a
later attempt first fences off the earlier ones (llmbus.state.fencing). If the claim or the
publish fails, the placement is rolled back and the request gets a final error; a final
error is published only by whoever claims the request's final marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from opentelemetry import trace

from llmbus.bus import BadMessage, Bus, decode
from llmbus.bus.replies import publish_error, reply_topic_of, result_out_since
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Control,
    ControlAction,
    Dispatch,
    DispatchOutcome,
    ErrorCode,
    ErrorInfo,
    ModelSpec,
    NodeProfile,
    RoutedRequest,
    WorkerStatus,
    now_ms,
)
from llmbus.contract.request_key import RequestKey
from llmbus.domain.fallback import fall_back
from llmbus.process.periodic import run_every
from llmbus.state.fencing import RequestFence, Superseded
from llmbus_services.scheduler.adapters.pool_stats import PoolStatsRecorder
from llmbus_services.scheduler.adapters.store import PlacementStore
from llmbus_services.scheduler.config import SchedulerSettings
from llmbus_services.scheduler.core.scheduler import Action, FinalError, PlaceAction, SchedulerCore
from llmbus_services.scheduler.core.types import Placement, SchedRequest

log = logging.getLogger(__name__)
FINALS_AT_ONCE = 256  # final errors being published at once (Redis round trips and Kafka acks)


class SchedulerHandlers:
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
        self.fleet_replay_end: dict[int, int] = {}  # llm.workers partition → its end offset when we started
        self.pool_stats = PoolStatsRecorder(
            settings.instance_id, settings.pool_stats_forget_after_s
        )  # the autoscaler's signals

    async def restore(self) -> int:
        placements = await self.store.load(self.settings.prefix_block_tokens, self.settings.max_prefix_blocks)
        self.core.fleet.restore(placements)
        self._restored = {p.request_key for p in placements}
        return len(placements)

    # -- consumers ---------------------------------------------------------------------------
    async def on_fleet(self, record: ConsumerRecord) -> None:
        base = record.topic.removeprefix(self.bus.topics.prefix)
        if base == t.WORKERS:
            status = decode(record, WorkerStatus)
            replayed = record.offset < self.fleet_replay_end.get(record.partition, 0)  # written before we started
            async with self._lock:
                await self._publish(self.core.on_heartbeat(status, now_ms(), replayed))
        elif base == t.NODES:
            self.core.on_node(decode(record, NodeProfile))
        elif base == t.MODELS:
            self.core.on_model(decode(record, ModelSpec))
        elif base == t.CONTROL:
            control = decode(record, Control)
            if control.action != ControlAction.CANCEL:
                return
            async with self._lock:
                # The target is the request's key (tenant and id): a tenant cancels its own requests only.
                request = self.core.cancel(RequestKey(control.target_id))  # a queued one; a placed one is its worker's
                if request is not None:
                    await self._publish([FinalError(request, ErrorInfo.of(ErrorCode.CANCELLED, "cancelled"))])

    async def on_routed(self, record: ConsumerRecord) -> None:
        routed = decode(record, RoutedRequest)
        spec = self.core.model_specs.get(routed.model)
        request = SchedRequest.from_routed(
            routed,
            now_ms(),
            self.settings.prefix_block_tokens,
            self.settings.max_prefix_blocks,
            spec.tokenizer if spec is not None else None,
        )
        rid = request.key
        restored = self.core.fleet.placement_of(rid)
        if restored is not None and rid in self._restored:
            self._restored.discard(rid)
            # Placed before a restart (the placement came from Redis) and its record redelivered:
            # the scheduler may have died between the claim and the Dispatch, so send it again.
            # The worker drops a Dispatch for a request it is running or has finished.
            await self._send(restored.worker_id, routed, restored.attempt, request.prefix_block_hashes)
            return
        self.pool_stats.on_arrival(request.model, now_ms())
        answered = self._answered.setdefault(rid, asyncio.get_running_loop().create_future())
        self._source[rid] = TopicPartition(record.topic, record.partition)
        # Placed later from the queue (timer or another record's handler), its Dispatch still
        # belongs to this record's trace: this handler's span stays open until it is answered.
        self._spans[rid] = trace.get_current_span()
        try:
            async with self._lock:
                await self._publish(self.core.submit(request, now_ms()))
            on_its_way = rid in self._delivering or rid in self._answering  # resolved when it is through
            if not self.core.queues.holds(request.model, rid) and not on_its_way:
                self._resolve(rid)  # answered, or already placed before a restart (a Dispatch on its way resolves it)
            await answered  # cancelled by a hand-over: the record stays uncommitted for the new owner
        finally:
            self._source.pop(rid, None)
            if not answered.done():  # failed before it was placed or answered: no waiter is left behind
                self._resolve(rid)

    async def on_routed_error(self, record: ConsumerRecord, exc: Exception) -> None:
        """A routed record whose handling failed: the DLQ entry, and the client's final error."""
        await self.bus.dead_letter(record, exc)
        try:
            routed = decode(record, RoutedRequest)
        except BadMessage:
            return  # the router wrote it: nothing to answer that it did not already
        request = SchedRequest.from_routed(routed, now_ms(), self.settings.prefix_block_tokens, 0)
        self._resolve(request.key)
        await self._fail(FinalError(request, _internal(exc)))

    def hand_over(self, revoked: set[TopicPartition]) -> int:
        """Partitions of llm.routed taken from us: what still waits here for them is dropped and its
        handler cancelled (uncommitted), so the new owner alone places or answers it."""
        handed = 0
        for rid, tp in list(self._source.items()):
            if tp not in revoked or self.core.cancel(rid) is None:
                continue  # another partition's, or placed already (its outcome is handled by any instance)
            self._source.pop(rid, None)
            future = self._answered.pop(rid, None)
            if future is not None and not future.done():
                future.cancel()
            handed += 1
        if handed:
            log.info("handed over %d waiting requests of revoked partitions %s", handed, sorted(map(str, revoked)))
        return handed

    async def on_outcome(self, record: ConsumerRecord) -> None:
        outcome = decode(record, DispatchOutcome)
        key = outcome.request_key
        try:
            await self.store.release(key, outcome.attempt)
        except Exception:  # the claim expires by itself; the outcome must still be acted on
            log.warning("could not release the claim of %s:%d", outcome.request_id, outcome.attempt, exc_info=True)
        async with self._lock:
            self.pool_stats.on_outcome(self.core.fleet.placement_of(key), now_ms())
            await self._publish(
                self.core.on_outcome(
                    key, outcome.attempt, outcome.status, outcome.error, now_ms(), outcome.prompt_tokens
                )
            )

    async def run_timer(self, stop: asyncio.Event) -> None:
        await run_every(self.settings.tick_ms / 1000, self.tick, name="scheduler timer", stop=stop)

    async def tick(self) -> None:
        async with self._lock:
            await self._publish(self.core.tick(now_ms()))

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
                        except Exception as exc:  # rolled back: the request gets its final error instead
                            log.exception("could not place %s", action.placement.key)
                            await self._fail(FinalError(action.request, _internal(exc)))
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
                    await self._fail(action)
        except Exception as exc:  # its record's handler raises it (DLQ, answer)
            log.warning("final error of %s not published", key, exc_info=True)
            self._answering.discard(key)
            self._resolve(key, exc)
        else:
            self._answering.discard(key)
            self._resolve(key)

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
            await self._send(placement.worker_id, routed, placement.attempt, action.request.prefix_block_hashes)
        except Exception as exc:
            log.exception("could not place %s", placement.key)
            try:
                async with self._lock:
                    await self._roll_back(placement)
                    await self._fail(FinalError(action.request, _internal(exc)))
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
        verdict = await self.fence.supersede(placement.request_key, placement.attempt)
        if verdict == Superseded.FENCED:
            return True
        self.core.forget(placement.request_key, placement.attempt)
        if verdict == Superseded.RESULT_PENDING:
            # An earlier attempt is publishing its result (or died doing so): ask again after its lease.
            self.core.delay(placement.request, now_ms() + self.fence.claim_lease_ms)
        else:
            log.info("%s: an earlier attempt's result is out; attempt %s not sent", *placement.key.rsplit(":", 1))
        return False

    async def _send(self, worker_id: str, routed: RoutedRequest, attempt: int, prefix_block_hashes: list[str]) -> None:
        view = self.core.fleet.workers.get(worker_id)
        topic = (view.dispatch_topic if view is not None and view.dispatch_topic else None) or self.bus.topics.dispatch(
            worker_id
        )
        dispatch = Dispatch(
            routed=routed, worker_id=worker_id, attempt=attempt, prefix_block_hashes=prefix_block_hashes
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
        if (rerouted := fall_back(routed, routed.model, action.error.code)) is not None:
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
            attempt=request.attempt,
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
            if (since_ms := await self.fence.lapsed_claim_ms(key)) is not None:
                # An attempt claimed the result and its lease lapsed before it marked it done: if its
                # result is out, that is the answer (marked now), not this error.
                bus = self.bus
                if (attempt := await result_out_since(bus.settings, bus.topics, key, since_ms)) is not None:
                    await self.fence.final_published(key, attempt)
                    return False
            return await self.fence.claim_for_error(key)
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


def _internal(exc: BaseException) -> ErrorInfo:
    """The final error of a request the scheduler failed to place (Redis or Kafka trouble): resend it
    under a new request id."""
    return ErrorInfo(
        code=ErrorCode.INTERNAL,
        message=f"could not place the request: {type(exc).__name__}: {exc}"[:2000],
        retryable=True,
        retry_after_ms=1000,
    )
