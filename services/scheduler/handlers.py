"""Scheduler handlers (thin): decode → SchedulerCore → publish its actions.

- llm.routed → `submit`; a request that must wait keeps its handler (and so its offset)
  open until it is placed or answered, so a crash never loses a queued request.
- llm.workers / llm.nodes / llm.models → the fleet view; llm.control cancels a queued request.
- llm.outcomes → release the placement, retry or give up.
- a timer → deadlines of queued requests and dead workers.
Every PlaceAction is claimed in Redis (PlacementStore) before its Dispatch is published.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka.structs import ConsumerRecord
from opentelemetry import trace

from llmbus import topics as t
from llmbus.bus import Bus, decode
from llmbus.fallback import fall_back
from llmbus.messages import (
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
from llmbus.replies import publish_error, reply_topic_of
from llmbus.state import DedupeStore
from services.scheduler.config import SchedulerSettings
from services.scheduler.policy.core import Action, FinalError, PlaceAction, SchedulerCore
from services.scheduler.policy.types import SchedRequest
from services.scheduler.store import PlacementStore

log = logging.getLogger(__name__)


class SchedulerHandlers:
    def __init__(
        self, bus: Bus, settings: SchedulerSettings, core: SchedulerCore, store: PlacementStore, markers: DedupeStore
    ) -> None:
        self.bus = bus
        self.markers = markers  # a worker skips an attempt marked superseded (e.g. one redelivered after its restart)
        self.settings = settings
        self.core = core
        self.store = store
        self._answered: dict[str, asyncio.Future[None]] = {}  # request id → set when placed or answered
        self._spans: dict[str, trace.Span] = {}  # request id → the span of its llm.routed record, until answered
        self._lock = asyncio.Lock()  # core calls and their publishes, one event at a time
        self._restored: set[str] = set()  # placements loaded from Redis whose Dispatch may never have gone out

    async def restore(self) -> int:
        placements = await self.store.load(self.settings.prefix_block_tokens, self.settings.max_prefix_blocks)
        self.core.fleet.restore(placements)
        self._restored = {p.request_id for p in placements}
        return len(placements)

    # -- consumers ---------------------------------------------------------------------------
    async def on_fleet(self, record: ConsumerRecord) -> None:
        base = record.topic.removeprefix(self.bus.topics.prefix)
        if base == t.WORKERS:
            status = decode(record, WorkerStatus)
            async with self._lock:
                await self._publish(self.core.on_heartbeat(status, now_ms()))
        elif base == t.NODES:
            self.core.on_node(decode(record, NodeProfile))
        elif base == t.MODELS:
            self.core.on_model(decode(record, ModelSpec))
        elif base == t.CONTROL:
            control = decode(record, Control)
            if control.action != ControlAction.CANCEL:
                return
            async with self._lock:
                request = self.core.cancel(control.target_id)  # a queued one; a placed one is its worker's
                if request is not None:
                    await self._publish([FinalError(request, ErrorInfo.of(ErrorCode.CANCELLED, "cancelled"))])

    async def on_routed(self, record: ConsumerRecord) -> None:
        routed = decode(record, RoutedRequest)
        request = SchedRequest.from_routed(
            routed, now_ms(), self.settings.prefix_block_tokens, self.settings.max_prefix_blocks
        )
        restored = self.core.fleet.placement_of(request.request_id)
        if restored is not None and request.request_id in self._restored:
            self._restored.discard(request.request_id)
            # Placed before a restart (the placement came from Redis) and its record redelivered:
            # the scheduler may have died between the claim and the Dispatch, so send it again.
            # The worker drops a Dispatch for a request it is running or has finished.
            await self._send(restored.worker_id, routed, restored.attempt, request.prefix_block_hashes)
            return
        answered = self._answered.setdefault(request.request_id, asyncio.get_running_loop().create_future())
        # Placed later from the queue (timer or another record's handler), its Dispatch still
        # belongs to this record's trace: this handler's span stays open until it is answered.
        self._spans[request.request_id] = trace.get_current_span()
        async with self._lock:
            await self._publish(self.core.submit(request, now_ms()))
        if request.request_id not in self.core.queues.of(request.model):
            self._resolve(request.request_id)  # placed, answered, or already placed before a restart
        await answered

    async def on_outcome(self, record: ConsumerRecord) -> None:
        outcome = decode(record, DispatchOutcome)
        await self.store.release(outcome.request_id, outcome.attempt)
        async with self._lock:
            await self._publish(
                self.core.on_outcome(outcome.request_id, outcome.attempt, outcome.status, outcome.error, now_ms())
            )

    async def run_timer(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.settings.tick_ms / 1000)
            except TimeoutError:
                pass
            async with self._lock:
                await self._publish(self.core.tick(now_ms()))

    # -- publishing ---------------------------------------------------------------------------
    async def _publish(self, actions: list[Action]) -> None:
        for action in actions:
            span = self._spans.get(action.request.request_id, trace.get_current_span())
            with trace.use_span(span, end_on_exit=False):
                if isinstance(action, PlaceAction):
                    await self._dispatch(action)
                elif isinstance(action, FinalError):
                    await self._fail(action)
            self._resolve(action.request.request_id)

    async def _dispatch(self, action: PlaceAction) -> None:
        placement = action.placement
        request = placement.request
        if request.routed is None or not await self.store.claim(placement):
            # Another instance placed this attempt first (or nothing to send): count nothing here.
            self.core.forget(placement.request_id, placement.attempt)
            return
        if placement.attempt > 1:
            await self.store.release(placement.request_id, placement.attempt - 1)
            await self.markers.mark_done("superseded", f"{placement.request_id}:{placement.attempt - 1}")
        await self._send(placement.worker_id, request.routed, placement.attempt, request.prefix_block_hashes)
        log.info("placed %s attempt %d on %s", placement.request_id, placement.attempt, placement.worker_id)

    async def _send(self, worker_id: str, routed: RoutedRequest, attempt: int, prefix_block_hashes: list[str]) -> None:
        view = self.core.fleet.workers.get(worker_id)
        topic = (view.dispatch_topic if view is not None and view.dispatch_topic else None) or self.bus.topics.dispatch(
            worker_id
        )
        dispatch = Dispatch(
            routed=routed, worker_id=worker_id, attempt=attempt, prefix_block_hashes=prefix_block_hashes
        )
        await self.bus.publisher.publish(
            topic, dispatch, key=routed.request_id, request_id=routed.request_id, tenant=routed.request.tenant
        )

    async def _fail(self, action: FinalError) -> None:
        request = action.request
        await self.store.release(request.request_id, request.attempt)
        routed = request.routed
        if routed is None:
            return
        if (rerouted := fall_back(routed, routed.model, action.error.code)) is not None:
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
        )

    def _resolve(self, request_id: str) -> None:
        self._spans.pop(request_id, None)
        future = self._answered.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(None)
