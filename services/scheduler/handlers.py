"""Scheduler handlers: routed → placed on a worker; outcomes → in-flight bookkeeping and retries."""

from __future__ import annotations

import asyncio
import logging

from aiokafka.structs import ConsumerRecord

from llmbus.bus import Bus, decode
from llmbus.messages import (
    Dispatch,
    DispatchOutcome,
    ErrorCode,
    ErrorInfo,
    OutcomeStatus,
    RoutedRequest,
    WorkerStatus,
)
from llmbus.replies import publish_error, reply_topic_of
from llmbus.state import DedupeStore
from services.scheduler.config import SchedulerSettings
from services.scheduler.core.fleet import Fleet

log = logging.getLogger(__name__)


class SchedulerHandlers:
    def __init__(self, bus: Bus, settings: SchedulerSettings, dedupe: DedupeStore) -> None:
        self.bus = bus
        self.settings = settings
        self.dedupe = dedupe
        self.fleet = Fleet(settings.heartbeat_stale_s)
        self.fleet_changed = asyncio.Event()
        self.in_flight: dict[str, tuple[RoutedRequest, str, int]] = {}  # request id → (routed, worker, attempt)

    async def on_worker_status(self, record: ConsumerRecord) -> None:
        self.fleet.observe(decode(record, WorkerStatus))
        self.fleet_changed.set()

    async def on_routed(self, record: ConsumerRecord) -> None:
        await self.place(decode(record, RoutedRequest), attempt=1)

    async def on_outcome(self, record: ConsumerRecord) -> None:
        outcome = decode(record, DispatchOutcome)
        self.fleet.finished(outcome.worker_id, outcome.request_id)
        placed = self.in_flight.pop(outcome.request_id, None)
        self.fleet_changed.set()
        if outcome.status != OutcomeStatus.RETRYABLE or placed is None:
            return
        routed, worker_id, attempt = placed
        if attempt >= self.settings.max_attempts:
            await self._fail(
                routed,
                ErrorInfo.of(ErrorCode.MAX_ATTEMPTS, f"{attempt} attempts failed; last: {outcome.error}"),
                attempt,
            )
            return
        await self.place(routed, attempt + 1, exclude=frozenset({worker_id}))

    async def place(self, routed: RoutedRequest, attempt: int, exclude: frozenset[str] = frozenset()) -> None:
        key = f"{routed.request_id}:{attempt}"
        if await self.dedupe.is_done("placed", key):
            return  # redelivered after a restart: already placed
        worker = await self._wait_for_worker(routed.model, exclude)
        if worker is None and exclude:
            worker = await self._wait_for_worker(routed.model, frozenset())
        if worker is None:
            await self._fail(
                routed, ErrorInfo.of(ErrorCode.MODEL_UNAVAILABLE, f"no ready worker serves {routed.model!r}"), attempt
            )
            return
        worker_id = worker.status.worker_id
        dispatch = Dispatch(routed=routed, worker_id=worker_id, attempt=attempt)
        self.fleet.placed(worker_id, routed.request_id)
        self.in_flight[routed.request_id] = (routed, worker_id, attempt)
        await self.bus.publisher.publish(
            worker.status.dispatch_topic or self.bus.topics.dispatch(worker_id),
            dispatch,
            key=routed.request_id,
            request_id=routed.request_id,
            tenant=routed.request.tenant,
        )
        await self.dedupe.mark_done("placed", key)

    async def _wait_for_worker(self, model: str, exclude: frozenset[str]):  # type: ignore[no-untyped-def]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.no_worker_timeout_s
        while (worker := self.fleet.least_loaded(model, exclude)) is None:
            remaining = deadline - loop.time()
            if remaining <= 0 or exclude:
                return None
            self.fleet_changed.clear()
            try:
                await asyncio.wait_for(self.fleet_changed.wait(), min(remaining, 1.0))
            except TimeoutError:
                pass
        return worker

    async def _fail(self, routed: RoutedRequest, error: ErrorInfo, attempt: int) -> None:
        request = routed.request
        await publish_error(
            self.bus.publisher,
            self.bus.topics,
            request_id=request.request_id,
            tenant=request.tenant,
            error=error,
            produced_by=self.bus.service,
            reply_topic=reply_topic_of(self.bus.topics, request.reply_topic),
            model=routed.model,
            shadow=routed.shadow,
            attempt=attempt,
        )
