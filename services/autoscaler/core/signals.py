"""What a scaling policy sees of one pool at one moment, built from PoolStats and heartbeats."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from llmbus.contract.messages import PoolStats, WorkerState, WorkerStatus

WARMING = (WorkerState.STARTING, WorkerState.WARMING)


@dataclass(frozen=True)
class PoolSignals:
    """One evaluation's inputs. Counts are over the last `window_s`; latency quantiles over the
    scheduler's sliding latency window; the rest are gauges now."""

    pool: str
    now_ms: int
    window_s: float
    arrivals: int = 0
    completed: int = 0
    queue_wait_ms_p50: float | None = None  # None: nothing was placed in the window
    queue_wait_ms_p99: float | None = None
    oldest_wait_ms: float = 0.0
    queued: int = 0
    in_flight: int = 0
    service_ms_mean: float | None = None
    workers_ready: int = 0
    workers_warming: int = 0
    slots_per_worker: int = 0  # requests a worker runs at once (max_num_seqs); 0: unknown
    cold_start_s: float | None = None  # the workers' own measurement (median)
    scheduler_instances: int = 1  # how many scheduler instances' statistics were merged
    # Latency inside the engines and the work there, in tokens (PoolStats).
    ttft_samples: int = 0
    ttft_ms_p50: float | None = None  # None: nothing finished in the latency window
    ttft_ms_p90: float | None = None
    ttft_ms_p99: float | None = None
    tpot_ms_p99: float | None = None
    prefill_backlog_tokens: int = 0
    kv_cache_usage_perc_mean: float = 0.0
    kv_cache_usage_perc_max: float = 0.0
    arrival_prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def arrival_rate_per_s(self) -> float:
        return self.arrivals / self.window_s if self.window_s > 0 else 0.0

    @property
    def queue_wait_ms(self) -> float:
        """The median wait of what was placed; when nothing could be placed, the oldest waiter's age."""
        placed = self.queue_wait_ms_p50 or 0.0
        return max(placed, self.oldest_wait_ms) if self.queued else placed

    def ttft_ms(self, quantile: str) -> float | None:
        """The TTFT quantile ("p50", "p90", "p99") over the latency window."""
        return {"p50": self.ttft_ms_p50, "p90": self.ttft_ms_p90, "p99": self.ttft_ms_p99}[quantile]

    def ttft_over(self, target_ms: float, quantile: str, min_samples: int) -> bool | None:
        """Whether the TTFT quantile is over `target_ms`; None when fewer than `min_samples` requests
        finished in the latency window (a lull inside a burst is no evidence either way)."""
        ttft = self.ttft_ms(quantile)
        if ttft is None or self.ttft_samples < min_samples:
            return None
        return ttft > target_ms

    @property
    def idle(self) -> bool:
        return self.arrivals == 0 and self.queued == 0 and self.in_flight == 0

    def values(self) -> dict[str, float]:
        """The signal values a ScaleDecision records."""
        out = {
            "queue_wait_ms": self.queue_wait_ms,
            "arrival_rate_per_s": round(self.arrival_rate_per_s, 4),
            "queued": float(self.queued),
            "in_flight": float(self.in_flight),
            "workers_ready": float(self.workers_ready),
            "workers_warming": float(self.workers_warming),
            "scheduler_instances": float(self.scheduler_instances),
        }
        if self.queue_wait_ms_p99 is not None:
            out["queue_wait_ms_p99"] = self.queue_wait_ms_p99
        if self.service_ms_mean is not None:
            out["service_ms_mean"] = round(self.service_ms_mean, 2)
        if self.cold_start_s is not None:
            out["cold_start_s"] = self.cold_start_s
        if self.ttft_ms_p99 is not None:
            out |= {"ttft_ms_p99": self.ttft_ms_p99, "ttft_samples": float(self.ttft_samples)}
        if self.ttft_ms_p50 is not None:
            out["ttft_ms_p50"] = self.ttft_ms_p50
        if self.tpot_ms_p99 is not None:
            out["tpot_ms_p99"] = self.tpot_ms_p99
        out |= {
            "prefill_backlog_tokens": float(self.prefill_backlog_tokens),
            "kv_cache_usage_perc_max": round(self.kv_cache_usage_perc_max, 4),
        }
        return out


@dataclass
class WorkerLife:
    worker_id: str
    pool: str
    state: WorkerState
    started_at_ms: int
    last_seen_ms: int
    cold_start_s: float | None = None


@dataclass
class FleetTable:
    """Workers by pool from llm.workers: who is ready or warming, their cold starts and lifetimes."""

    stale_ms: int = 5_000
    workers: dict[str, WorkerLife] = field(default_factory=dict)
    slots: dict[str, int] = field(default_factory=dict)  # pool → max_num_seqs of its workers

    def on_status(self, status: WorkerStatus) -> None:
        pool = status.models[0] if status.models else ""
        self.workers[status.worker_id] = WorkerLife(
            status.worker_id, pool, status.state, status.started_at_ms, status.sent_at_ms, status.cold_start_s
        )
        self.slots[pool] = status.max_num_seqs or self.slots.get(pool, 0)

    def live(self, pool: str, now_ms: int) -> list[WorkerLife]:
        return [
            w
            for w in self.workers.values()
            if w.pool == pool and w.state != WorkerState.STOPPED and now_ms - w.last_seen_ms <= self.stale_ms
        ]

    def cold_start_s(self, pool: str) -> float | None:
        measured = [w.cold_start_s for w in self.workers.values() if w.pool == pool and w.cold_start_s]
        return statistics.median(measured) if measured else None

    def signals(self, stats: PoolStats, now_ms: int) -> PoolSignals:
        live = self.live(stats.pool, now_ms)
        return PoolSignals(
            pool=stats.pool,
            now_ms=now_ms,
            window_s=stats.window_s,
            arrivals=stats.arrivals,
            completed=stats.completed,
            queue_wait_ms_p50=stats.queue_wait_ms_p50,
            queue_wait_ms_p99=stats.queue_wait_ms_p99,
            oldest_wait_ms=stats.oldest_wait_ms,
            queued=stats.queued,
            in_flight=stats.in_flight,
            service_ms_mean=stats.service_ms_mean,
            workers_ready=sum(1 for w in live if w.state == WorkerState.READY),
            workers_warming=sum(1 for w in live if w.state in WARMING),
            slots_per_worker=self.slots.get(stats.pool, 0),
            cold_start_s=self.cold_start_s(stats.pool),
            scheduler_instances=stats.instance_id.count("+") + 1,  # merged statistics name every instance
            ttft_samples=stats.ttft_samples,
            ttft_ms_p50=stats.ttft_ms_p50,
            ttft_ms_p90=stats.ttft_ms_p90,
            ttft_ms_p99=stats.ttft_ms_p99,
            tpot_ms_p99=stats.tpot_ms_p99,
            prefill_backlog_tokens=stats.prefill_backlog_tokens,
            kv_cache_usage_perc_mean=stats.kv_cache_usage_perc_mean,
            kv_cache_usage_perc_max=stats.kv_cache_usage_perc_max,
            arrival_prompt_tokens=stats.arrival_prompt_tokens,
            completion_tokens=stats.completion_tokens,
        )
