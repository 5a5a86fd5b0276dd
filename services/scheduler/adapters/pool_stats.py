"""Per-pool scaling signals of the scheduler: queue wait, latency inside the engines, work in flight.

`PoolStatsRecorder` is fed by the handlers (one call per arrival, placement and outcome) and
turned into one `PoolStats` per pool every `interval_s` by `publish_pool_stats`:
- queue wait (routed → placed on a worker), per window;
- TTFT and time per output token as each request's result reports them (they come back on its
  DispatchOutcome), over a sliding `latency_window_s`: what a request waits inside the engine,
  behind other prompts' prefill, shows here and not in queue wait;
- the prefill backlog (prompt tokens admitted and not yet prefilled, from the workers' heartbeats,
  plus what was placed since each) and KV-cache use, now; arrivals' prompt tokens and completions'
  output tokens per window (the work in tokens, for sizing).
The same signals are Prometheus series (`llmbus_scheduler_queue_wait_seconds`,
`llmbus_scheduler_time_to_first_token_seconds`, `llmbus_scheduler_prefill_backlog_tokens`, ...,
label `model_name`): what the KEDA ScaledObjects in deploy/k8s/keda/ query.

A pool is a model name, and clients choose model names. So the pools reported are bounded: every
pool of a model this process knows (the fleet's heartbeats, the registry: MODEL_LABELS), and of the
others only the `max_unknown_pools` busiest; the metric series of unknown names are one `other`
series. Each interval's statistics go out as one batch (one record batch per partition, every ack
awaited together), so a burst of names cannot delay a real pool's report past the autoscaler's
staleness cut (30 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
from collections import deque
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

from llmbus.bus import Bus
from llmbus.contract import topics as t
from llmbus.contract.messages import DispatchOutcome, PoolStats, ReleaseContext, WorkerState, now_ms
from llmbus.observability.metric_children import MODEL_LABELS, OTHER, children_of, model_label
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
# vLLM's stems (vllm:time_to_first_token_seconds, vllm:request_time_per_output_token_seconds), measured
# from the request's arrival at the router, not at the engine. Buckets around the tiers' targets.
TTFT_SECONDS = Histogram(
    "llmbus_scheduler_time_to_first_token_seconds",
    "Received → first token, as each request's result reports it",
    ["model_name"],
    buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
_ttft = children_of(TTFT_SECONDS)
TPOT_SECONDS = Histogram(
    "llmbus_scheduler_request_time_per_output_token_seconds",
    "Mean time per output token after the first, per request",
    ["model_name"],
    buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5),
)
_tpot = children_of(TPOT_SECONDS)
PREFILL_BACKLOG = Gauge(
    "llmbus_scheduler_prefill_backlog_tokens",
    "Prompt tokens admitted to the pool's engines, not yet prefilled",
    ["model_name"],
)
KV_USE = Gauge("llmbus_scheduler_kv_cache_usage_perc", "Mean KV-cache use of the pool's ready workers", ["model_name"])
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
    prompt_tokens: int = 0  # of the arrivals
    completion_tokens: int = 0  # of the completions
    waits_ms: list[float] = field(default_factory=list)
    service_ms: list[float] = field(default_factory=list)
    release: ReleaseContext | None = None  # of the window's requests: the new version's side where there is one


@dataclass
class _Latency:
    """Finished requests' (at_ms, ttft_ms, tpot_ms) over the sliding latency window."""

    samples: deque[tuple[int, float, float | None]] = field(default_factory=deque)

    def prune(self, now_ms: int, window_ms: int) -> None:
        while self.samples and self.samples[0][0] <= now_ms - window_ms:
            self.samples.popleft()


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class PoolStatsRecorder:
    """Per-pool windows, and the pools' metric series, for pools with recent traffic only.

    A pool is a model name a client chose: one idle (no arrivals, placements, outcomes, nothing
    queued or in flight) for `forget_after_s` is forgotten, statistics and series, else every name
    ever sent would be kept and republished forever. The default outlasts the autoscaler's idle
    window (10 min to scale down), so it sees a pool go quiet before the pool goes silent.
    """

    def __init__(
        self,
        instance_id: str = "",
        forget_after_s: float = 900.0,
        max_unknown_pools: int = 32,
        latency_window_s: float = 60.0,
    ) -> None:
        self.instance_id = instance_id
        self.forget_after_ms = int(forget_after_s * 1000)
        self.max_unknown_pools = max_unknown_pools
        self.latency_window_ms = int(latency_window_s * 1000)
        self._windows: dict[str, _Window] = {}
        self._latency: dict[str, _Latency] = {}
        self._last_busy_ms: dict[str, int] = {}
        self._window_start_ms: int | None = None  # the last snapshot: where every pool's window starts

    def _window(self, pool: str, now: int) -> _Window:
        window = self._windows.get(pool)
        if window is None:
            # A pool first seen mid-window counts from the window's start, so rates are per window.
            start = now if self._window_start_ms is None else self._window_start_ms
            window = self._windows[pool] = _Window(start)
        return window

    def on_arrival(
        self, pool: str, at_ms: int, release: ReleaseContext | None = None, *, prompt_tokens: int = 0
    ) -> None:
        window = self._window(pool, at_ms)
        window.arrivals += 1
        window.prompt_tokens += prompt_tokens
        if release is not None and (window.release is None or not release.on_previous):
            window.release = release
        _arrivals(model_label(pool)).inc()

    def on_placed(self, placement: Placement, routed_at_ms: int, at_ms: int) -> None:
        if placement.attempt != 1:
            return  # a retry's wait is not the pool's queue
        wait_ms = float(max(0, at_ms - routed_at_ms))
        self._window(placement.model, at_ms).waits_ms.append(wait_ms)
        _queue_wait(model_label(placement.model)).observe(wait_ms / 1000)

    def on_outcome(self, placement: Placement | None, at_ms: int, outcome: DispatchOutcome | None = None) -> None:
        if placement is None:
            return
        if outcome is None:
            self.on_finished(placement, at_ms)
        else:
            self.on_finished(placement, at_ms, outcome.completion_tokens, outcome.ttft_ms, outcome.tpot_ms)

    def on_finished(
        self,
        placement: Placement,
        at_ms: int,
        completion_tokens: int = 0,
        ttft_ms: float | None = None,
        tpot_ms: float | None = None,
    ) -> None:
        """An attempt's outcome, as the values its DispatchOutcome carries (the replay benchmark's way in)."""
        pool = placement.model
        window = self._window(pool, at_ms)
        window.completed += 1
        window.service_ms.append(float(max(0, at_ms - placement.placed_at_ms)))
        window.completion_tokens += completion_tokens
        if ttft_ms is not None:
            self._latency.setdefault(pool, _Latency()).samples.append((at_ms, ttft_ms, tpot_ms))
            _ttft(model_label(pool)).observe(ttft_ms / 1000)
            if tpot_ms is not None:
                _tpot(model_label(pool)).observe(tpot_ms / 1000)

    def snapshot(self, core: SchedulerCore, now: int) -> list[PoolStats]:
        """One PoolStats per pool to report (below); starts the next window.

        Pools only in the fleet are left out: with several instances, the one that owns a
        model's partition speaks for it, and the others must not report it as idle. Reported are
        the pools of known models and the `max_unknown_pools` busiest others; every pool's activity
        (cheap counts) still keeps it from being forgotten.
        """
        pools = set(self._windows) | set(core.queues.by_model)
        load = _fleet_load(core, now)
        activity = {pool: self._activity(pool, core, load.in_flight) for pool in pools}
        for pool, busy in activity.items():
            if busy:
                self._last_busy_ms[pool] = now
        reported = self._reported(activity)
        stats = [self._stats_of(pool, core, now, load) for pool in sorted(reported)]
        self._export_gauges(activity, core, load)
        kept = {pool for pool in pools if now - self._last_busy_ms.get(pool, now) < self.forget_after_ms}
        if gone := pools - kept:
            self._forget(gone, kept)
        self._windows = {pool: _Window(now) for pool in kept}
        self._window_start_ms = now
        return stats

    def _activity(self, pool: str, core: SchedulerCore, in_flight: dict[str, int]) -> int:
        window = self._windows.get(pool)
        queue = core.queues.by_model.get(pool)
        counted = window.arrivals + len(window.waits_ms) + window.completed if window is not None else 0
        return counted + (len(queue) if queue is not None else 0) + in_flight.get(pool, 0)

    def _reported(self, activity: dict[str, int]) -> set[str]:
        known = {pool for pool in activity if MODEL_LABELS.knows(pool)}
        unknown = sorted((pool for pool in activity if pool not in known), key=lambda p: (-activity[p], p))
        if len(unknown) > self.max_unknown_pools:
            log.debug("pool statistics: %d unknown model names, %d reported", len(unknown), self.max_unknown_pools)
        return known | set(unknown[: self.max_unknown_pools])

    @staticmethod
    def _export_gauges(activity: dict[str, int], core: SchedulerCore, load: _FleetLoad) -> None:
        """Waiting, in flight, prefill backlog and KV use per model label: every unknown name adds to
        the one `other` series."""
        waiting: dict[str, int] = {}
        placed: dict[str, int] = {}
        backlog: dict[str, int] = {}
        kv_use: dict[str, list[float]] = {}
        for pool in activity:
            label = model_label(pool)
            queue = core.queues.by_model.get(pool)
            waiting[label] = waiting.get(label, 0) + (len(queue) if queue is not None else 0)
            placed[label] = placed.get(label, 0) + load.in_flight.get(pool, 0)
            backlog[label] = backlog.get(label, 0) + load.backlog_tokens.get(pool, 0)
            kv_use.setdefault(label, []).extend(load.kv_use.get(pool, []))
        for label in waiting:
            QUEUED.labels(label).set(waiting[label])
            IN_FLIGHT.labels(label).set(placed[label])
            PREFILL_BACKLOG.labels(label).set(backlog[label])
            KV_USE.labels(label).set(statistics.fmean(kv_use[label]) if kv_use[label] else 0.0)

    def _forget(self, pools: set[str], kept: set[str]) -> None:
        still_labelled = {model_label(pool) for pool in kept} | {OTHER}
        for pool in pools:
            self._last_busy_ms.pop(pool, None)
            self._latency.pop(pool, None)
            if (label := model_label(pool)) in still_labelled:
                continue
            for metric in (
                QUEUED,
                IN_FLIGHT,
                PREFILL_BACKLOG,
                KV_USE,
                ARRIVALS_TOTAL,
                QUEUE_WAIT_SECONDS,
                TTFT_SECONDS,
                TPOT_SECONDS,
            ):
                with contextlib.suppress(KeyError):
                    metric.remove(label)
        # The remembered children would point at removed series: look them up afresh.
        for children in (_arrivals, _queue_wait, _ttft, _tpot):
            children.cache_clear()  # type: ignore[union-attr]
        log.info("pool statistics of %d idle pools forgotten: %s", len(pools), sorted(pools)[:10])

    @property
    def pools(self) -> set[str]:
        """The pools with a window now (for tests and tools)."""
        return set(self._windows)

    def _stats_of(self, pool: str, core: SchedulerCore, now: int, load: _FleetLoad) -> PoolStats:
        window = self._windows.get(pool) or _Window(now)
        waits = sorted(window.waits_ms)
        queue = core.queues.by_model.get(pool)
        waiting = list(queue.in_order()) if queue is not None else []
        workers = [w for w in core.fleet.workers.values() if pool in w.models]
        live = [w for w in workers if core.fleet.heard(w, now, core.recovery.heartbeat_timeout_ms)]
        ready = [w for w in live if w.state == WorkerState.READY]
        kv_use = load.kv_use.get(pool, [])
        latency = self._latency.get(pool) or _Latency()
        latency.prune(now, self.latency_window_ms)
        ttfts = sorted(ttft for _, ttft, _ in latency.samples)
        tpots = sorted(tpot for _, _, tpot in latency.samples if tpot is not None)
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
            in_flight=load.in_flight.get(pool, 0),
            workers_ready=len(ready),
            workers_warming=sum(1 for w in live if w.state in WARMING),
            workers_draining=sum(1 for w in live if w.state == WorkerState.DRAINING),
            kv_cache_usage_perc_mean=statistics.fmean(kv_use) if kv_use else 0.0,
            kv_cache_usage_perc_max=max(kv_use, default=0.0),
            latency_window_s=self.latency_window_ms / 1000,
            ttft_samples=len(ttfts),
            ttft_ms_p50=_quantile(ttfts, 0.5) if ttfts else None,
            ttft_ms_p90=_quantile(ttfts, 0.9) if ttfts else None,
            ttft_ms_p99=_quantile(ttfts, 0.99) if ttfts else None,
            tpot_ms_p50=_quantile(tpots, 0.5) if tpots else None,
            tpot_ms_p99=_quantile(tpots, 0.99) if tpots else None,
            prefill_backlog_tokens=load.backlog_tokens.get(pool, 0),
            arrival_prompt_tokens=window.prompt_tokens,
            completion_tokens=window.completion_tokens,
            sent_at_ms=now,
            release=window.release or (spec.release if (spec := core.model_specs.get(pool)) is not None else None),
        )


@dataclass
class _FleetLoad:
    """Per model of the workers: placed and not finished (every worker), the prefill backlog (live
    workers) and KV use (ready workers)."""

    in_flight: dict[str, int] = field(default_factory=dict)
    backlog_tokens: dict[str, int] = field(default_factory=dict)
    kv_use: dict[str, list[float]] = field(default_factory=dict)


def _fleet_load(core: SchedulerCore, now: int) -> _FleetLoad:
    """One pass over the fleet, not one per pool."""
    load = _FleetLoad()
    for worker in core.fleet.workers.values():
        live = core.fleet.heard(worker, now, core.recovery.heartbeat_timeout_ms)
        for model in worker.models:
            load.in_flight[model] = load.in_flight.get(model, 0) + worker.inflight_count
            if live:
                load.backlog_tokens[model] = load.backlog_tokens.get(model, 0) + worker.prefill_backlog_tokens_est
                if worker.state == WorkerState.READY:
                    load.kv_use.setdefault(model, []).append(_kv_use(worker))
    return load


def _kv_use(worker: WorkerView) -> float:
    used = 1.0 - worker.kv_blocks_free_reported / worker.kv_blocks_total if worker.kv_blocks_total else 0.0
    return min(1.0, max(0.0, used))


async def publish_once(bus: Bus, recorder: PoolStatsRecorder, core: SchedulerCore) -> int:
    """One interval's PoolStats on llm.pool-stats as one batch, every ack awaited together; how many."""
    stats = recorder.snapshot(core, now_ms())
    await bus.publisher.publish_many(bus.topics.name(t.POOL_STATS), [(s, None, s.pool) for s in stats])
    return len(stats)


async def publish_pool_stats(
    bus: Bus, recorder: PoolStatsRecorder, core: SchedulerCore, interval_s: float, stop: asyncio.Event
) -> None:
    """Every interval_s: one PoolStats per reported pool on llm.pool-stats."""

    async def sample() -> None:
        try:
            await publish_once(bus, recorder, core)
        except Exception:  # a missed sample is not worth stopping the scheduler for
            log.warning("pool statistics not published", exc_info=True)

    await run_every(interval_s, sample, name="pool stats", stop=stop)
