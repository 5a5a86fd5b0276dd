"""Per-pool scaling signals of the scheduler: queue wait (routed → placed), arrivals, in flight.

`PoolStatsRecorder` is fed by the handlers (one call per arrival, placement and outcome) and
turned into one `PoolStats` per pool every `interval_s` by `publish_pool_stats`. Queue wait is
also a Prometheus histogram (`llmbus_scheduler_queue_wait_seconds{model_name}`), the metric the
KEDA ScaledObjects in deploy/k8s/ query.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

from llmbus.bus import Bus
from llmbus.contract import topics as t
from llmbus.contract.messages import PoolStats, WorkerState, now_ms
from llmbus.observability.metric_children import children_of
from llmbus.process.periodic import run_every
from llmbus_services.scheduler.core.scheduler import SchedulerCore
from llmbus_services.scheduler.core.types import Placement, WorkerView

log = logging.getLogger(__name__)

QUEUE_WAIT_SECONDS = Histogram(
    "llmbus_scheduler_queue_wait_seconds",
    "Routed → placed on a worker (first attempts)",
    ["model_name"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
)
_queue_wait = children_of(QUEUE_WAIT_SECONDS)
ARRIVALS_TOTAL = Counter("llmbus_scheduler_arrivals_total", "Routed requests received", ["model_name"])
_arrivals = children_of(ARRIVALS_TOTAL)  # the two per-request series: children looked up once
QUEUED = Gauge("llmbus_scheduler_num_requests_waiting", "Requests waiting for a worker", ["model_name"])
IN_FLIGHT = Gauge("llmbus_scheduler_num_requests_in_flight", "Placed and not finished", ["model_name"])

WARMING = (WorkerState.STARTING, WorkerState.WARMING)


@dataclass
class _Window:
    start_ms: int
    arrivals: int = 0
    completed: int = 0
    waits_ms: list[float] = field(default_factory=list)
    service_ms: list[float] = field(default_factory=list)


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class PoolStatsRecorder:
    """Per-pool windows, and the pools' metric series, for pools with recent traffic only.

    A pool is a model name a client chose: one idle (no arrivals, placements, outcomes, nothing
    queued or in flight) for `forget_after_s` is forgotten, statistics and series, else every name
    ever sent would be kept and republished forever. The default outlasts the autoscaler's idle
    window (10 min to scale down), so it sees a pool go quiet before the pool goes silent.
    """

    def __init__(self, instance_id: str = "", forget_after_s: float = 900.0) -> None:
        self.instance_id = instance_id
        self.forget_after_ms = int(forget_after_s * 1000)
        self._windows: dict[str, _Window] = {}
        self._last_busy_ms: dict[str, int] = {}
        self._window_start_ms: int | None = None  # the last snapshot: where every pool's window starts

    def _window(self, pool: str, now: int) -> _Window:
        window = self._windows.get(pool)
        if window is None:
            # A pool first seen mid-window counts from the window's start, so rates are per window.
            start = now if self._window_start_ms is None else self._window_start_ms
            window = self._windows[pool] = _Window(start)
        return window

    def on_arrival(self, pool: str, at_ms: int) -> None:
        self._window(pool, at_ms).arrivals += 1
        _arrivals(pool).inc()

    def on_placed(self, placement: Placement, routed_at_ms: int, at_ms: int) -> None:
        if placement.attempt != 1:
            return  # a retry's wait is not the pool's queue
        wait_ms = float(max(0, at_ms - routed_at_ms))
        self._window(placement.model, at_ms).waits_ms.append(wait_ms)
        _queue_wait(placement.model).observe(wait_ms / 1000)

    def on_outcome(self, placement: Placement | None, at_ms: int) -> None:
        if placement is None:
            return
        window = self._window(placement.model, at_ms)
        window.completed += 1
        window.service_ms.append(float(max(0, at_ms - placement.placed_at_ms)))

    def snapshot(self, core: SchedulerCore, now: int) -> list[PoolStats]:
        """One PoolStats per pool this instance has had traffic for; starts the next window.

        Pools only in the fleet are left out: with several instances, the one that owns a
        model's partition speaks for it, and the others must not report it as idle.
        """
        pools = set(self._windows) | set(core.queues.by_model)
        stats = [self._stats_of(pool, core, now) for pool in sorted(pools)]
        for s in stats:
            if s.arrivals or s.placed or s.completed or s.queued or s.in_flight:
                self._last_busy_ms[s.pool] = now
        kept = {pool for pool in pools if now - self._last_busy_ms.get(pool, now) < self.forget_after_ms}
        if gone := pools - kept:
            self._forget(gone)
        self._windows = {pool: _Window(now) for pool in kept}
        self._window_start_ms = now
        return stats

    def _forget(self, pools: set[str]) -> None:
        for pool in pools:
            self._last_busy_ms.pop(pool, None)
            for metric in (QUEUED, IN_FLIGHT, ARRIVALS_TOTAL, QUEUE_WAIT_SECONDS):
                with contextlib.suppress(KeyError):
                    metric.remove(pool)
        # The remembered children would point at removed series: look them up afresh.
        _arrivals.cache_clear()  # type: ignore[attr-defined]
        _queue_wait.cache_clear()  # type: ignore[attr-defined]
        log.info("pool statistics of %d idle pools forgotten: %s", len(pools), sorted(pools)[:10])

    @property
    def pools(self) -> set[str]:
        """The pools with a window now (for tests and tools)."""
        return set(self._windows)

    def _stats_of(self, pool: str, core: SchedulerCore, now: int) -> PoolStats:
        window = self._windows.get(pool) or _Window(now)
        waits = sorted(window.waits_ms)
        queue = core.queues.by_model.get(pool)
        waiting = list(queue.in_order()) if queue is not None else []
        workers = [w for w in core.fleet.workers.values() if pool in w.models]
        live = [w for w in workers if core.fleet.heard(w, now, core.recovery.heartbeat_timeout_ms)]
        ready = [w for w in live if w.state == WorkerState.READY]
        in_flight = sum(w.inflight_count for w in workers)
        QUEUED.labels(pool).set(len(waiting))
        IN_FLIGHT.labels(pool).set(in_flight)
        return PoolStats(
            pool=pool,
            instance_id=self.instance_id,
            window_start_ms=window.start_ms,
            window_s=max(0.0, (now - window.start_ms) / 1000),
            arrivals=window.arrivals,
            placed=len(waits),
            completed=window.completed,
            queue_wait_ms_p50=_quantile(waits, 0.5) if waits else None,
            queue_wait_ms_p90=_quantile(waits, 0.9) if waits else None,
            queue_wait_ms_p99=_quantile(waits, 0.99) if waits else None,
            queue_wait_ms_max=waits[-1] if waits else None,
            service_ms_mean=statistics.fmean(window.service_ms) if window.service_ms else None,
            queued=len(waiting),
            oldest_wait_ms=float(max((now - r.arrived_at_ms for r in waiting), default=0)),
            in_flight=in_flight,
            workers_ready=len(ready),
            workers_warming=sum(1 for w in live if w.state in WARMING),
            workers_draining=sum(1 for w in live if w.state == WorkerState.DRAINING),
            kv_cache_usage_perc_mean=statistics.fmean(_kv_use(w) for w in ready) if ready else 0.0,
            sent_at_ms=now,
        )


def _kv_use(worker: WorkerView) -> float:
    return 1.0 - worker.kv_blocks_free_reported / worker.kv_blocks_total if worker.kv_blocks_total else 0.0


async def publish_pool_stats(
    bus: Bus, recorder: PoolStatsRecorder, core: SchedulerCore, interval_s: float, stop: asyncio.Event
) -> None:
    """Every interval_s: one PoolStats per pool on llm.pool-stats."""
    topic = bus.topics.name(t.POOL_STATS)

    async def sample() -> None:
        for stats in recorder.snapshot(core, now_ms()):
            try:
                await bus.publisher.publish(topic, stats, key=stats.pool)
            except Exception:  # a missed sample is not worth stopping the scheduler for
                log.warning("pool stats for %s not published", stats.pool, exc_info=True)

    await run_every(interval_s, sample, name="pool stats", stop=stop)
