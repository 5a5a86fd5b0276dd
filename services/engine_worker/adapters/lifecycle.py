"""The worker's state machine and heartbeat: starting → warming → ready ⇄ unhealthy → draining → stopped.

Ready is reported as DEGRADED while the engine's upstream circuit breaker is not closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from llmbus.bus import Bus
from llmbus.contract import topics as t
from llmbus.contract.messages import NodeProfile, WorkerState, now_ms
from llmbus.process.periodic import run_every
from llmbus_services.engine_worker.adapters import metrics
from llmbus_services.engine_worker.adapters.node.publish import NodeProfiles
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.breaker import UpstreamHealth
from llmbus_services.engine_worker.core.node_plan import NodePlan, gpu_healthy
from llmbus_services.engine_worker.core.status import RateTracker, build_status
from llmbus_services.engine_worker.flows import WorkerHandlers

log = logging.getLogger(__name__)


class Lifecycle:
    def __init__(
        self,
        bus: Bus,
        settings: WorkerSettings,
        handlers: WorkerHandlers,
        dispatch_topic: str,
        plan: NodePlan,
        profiles: NodeProfiles,
    ) -> None:
        self.bus, self.settings, self.handlers, self.dispatch_topic = bus, settings, handlers, dispatch_topic
        self.plan = plan
        self.profiles = profiles
        self.state = WorkerState.STARTING
        self.cold_start_s: float | None = None
        self.cold_start_phases_s: dict[str, float] = {}
        self.started_at_ms = now_ms()
        self._rates = RateTracker()
        self.profile: NodeProfile | None = None  # the latest node profile (DCGM-named gauges read it)
        self.handover: asyncio.Task[None] | None = None  # a drain's handover, after its grace
        handlers.on_drain = self.drained_by_control

    async def drained_by_control(self) -> None:
        """Control(drain): out of placement now; the process keeps running (and finishing) until stopped."""
        log.info("drained by control: taking no new work")
        self._hand_over_after_grace()
        try:
            await self.set_state(WorkerState.DRAINING)
        except Exception:  # the next periodic heartbeat says it
            log.warning("draining heartbeat failed", exc_info=True)

    def _hand_over_after_grace(self) -> None:
        """After `handover_grace_s`, the answers that can be continued go on elsewhere (flows/control.py)."""
        if self.handover is not None:
            return

        async def hand_over() -> None:
            await asyncio.sleep(self.settings.handover_grace_s)
            await self.handlers.hand_over()

        self.handover = asyncio.create_task(hand_over(), name="drain handover")

    async def stop_handover(self) -> None:
        if self.handover is not None and not self.handover.done():
            self.handover.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.handover

    def reported_state(self) -> WorkerState:
        engine = self.handlers.engine
        if self.state == WorkerState.READY and isinstance(engine, UpstreamHealth) and engine.upstream_degraded:
            return WorkerState.DEGRADED
        return self.state

    async def beat(self) -> None:
        status = build_status(
            self.settings,
            self.handlers.engine,
            self.reported_state(),
            self.dispatch_topic,
            self._rates,
            time.monotonic(),
            cold_start_s=self.cold_start_s,
            started_at_ms=self.started_at_ms,
            cold_start_phases_s=self.cold_start_phases_s,
            model_format=self.plan.model_format,
            gpu_healthy=self.plan.gpu_healthy,
            ecc_uncorrected=self.plan.ecc_uncorrected,
            formats_supported=self.plan.formats_supported,
            oldest_running_started_at_ms=self.handlers.oldest_running_started_at_ms(),
        )
        metrics.export(status)
        await self.bus.publisher.publish(self.bus.topics.name(t.WORKERS), status, key=self.settings.worker_id)

    async def set_state(self, state: WorkerState) -> None:
        if self.handlers.draining and state in (WorkerState.WARMING, WorkerState.READY, WorkerState.UNHEALTHY):
            state = WorkerState.DRAINING  # a drained worker stays drained (an engine restart included)
        self.state = state
        await self.beat()

    async def watch_upstream_forever(self, interval_s: float = 0.2) -> None:
        """Probe a failing upstream when its breaker is due, and beat at once when degraded flips:
        the scheduler stops (or resumes) placing here without waiting for the next heartbeat."""
        engine = self.handlers.engine
        if not isinstance(engine, UpstreamHealth):
            return
        reported = engine.upstream_degraded

        async def watch() -> None:
            nonlocal reported
            await engine.probe_upstream_if_due()
            if engine.upstream_degraded != reported:
                reported = engine.upstream_degraded
                log.warning("upstream %s", "failing: degraded" if reported else "answers again: ready")
                await self.beat()

        await run_every(interval_s, watch, name="upstream watch")

    async def reprofile(self) -> None:
        profile = await self.profiles.refresh()
        self.profile = profile
        ecc = sum(g.ecc_uncorrected_volatile or 0 for g in profile.gpus)
        healthy = gpu_healthy(profile)
        if healthy != self.plan.gpu_healthy:
            log.error("GPU health changed: healthy=%s, uncorrected ECC=%d", healthy, ecc)
        self.plan = NodePlan(
            self.plan.settings, self.plan.model_format, self.plan.formats_supported, healthy, ecc, self.plan.reason
        )

    async def restart_engine_on_failure(self) -> None:
        """A dead engine is restarted (with backoff); meanwhile dispatches are refused as retryable."""
        backoff_s = 1.0
        while True:
            await self.handlers.engine_failed.wait()
            await self.set_state(WorkerState.UNHEALTHY)
            engine = self.handlers.engine
            try:
                with contextlib.suppress(Exception):
                    await engine.stop()
                await engine.start()
                await engine.warmup()
            except Exception:
                log.exception("engine restart failed; retrying in %.0fs", backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 60.0)
                continue
            backoff_s = 1.0
            self.handlers.engine_failed.clear()
            await self.set_state(WorkerState.READY)

    async def drain(self) -> None:
        """Stop taking work: DRAINING is said before the dispatch loop stops taking records; answers that can
        be continued are handed over after `handover_grace_s`; the runtime lets the others finish for
        `drain_grace_s` and hands back the rest (`abort_all`)."""
        self.handlers.draining = True
        self._hand_over_after_grace()
        await self.set_state(WorkerState.DRAINING)
