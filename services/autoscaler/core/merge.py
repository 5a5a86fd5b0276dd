"""Pool statistics from several scheduler instances, combined per pool before a policy sees them.

Each scheduler instance publishes its own PoolStats for the pools whose requests it handled
(the instance that owns a model's llm.routed partition; two of them during a rebalance, or
more when a pool's traffic is spread over partitions). A policy must see the pool as a whole
once per period, not one instance's view after the other: `PoolStatsMerger.add` collects what
each instance sent since the pool's last evaluation and returns one merged PoolStats when
every live instance has reported (or `max_wait_s` has passed since the last evaluation).

Merging, per pool:
- counts over the window (arrivals, placed, completed): summed over every window received;
  `window_s` is the instances' mean window, so arrivals / window_s is the sum of their rates;
- gauges (queued, in flight): each live instance's latest, summed; the oldest waiter: the max;
- queue wait: the median is the placed-weighted median of the instances' medians (percentiles
  do not add up; this is exact when one instance placed everything), the tail (p90, p99, max)
  the largest of any instance's: an upper bound, on the side of scaling up;
- service time: the completed-weighted mean; token counts (arrivals' prompts, completions'
  outputs): summed like the other counts;
- latency (TTFT, time per output token) is over each instance's sliding window of its own
  finished requests, a gauge: the median weighted by each instance's samples, the tails the
  largest of any instance's;
- workers (ready, warming, draining), KV use and the prefill backlog: every instance sees the
  whole fleet through llm.workers, so the freshest instance's view (the backlog: the largest,
  since each instance adds only what it placed since the heartbeats).
An instance that has sent nothing for `stale_s` no longer counts (it stopped, or its partition
moved to another one that now reports the same requests).
Time is the statistics' own `sent_at_ms`, so the merge runs the same in virtual time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from llmbus.contract.messages import PoolStats


@dataclass
class _PoolRound:
    latest: dict[str, PoolStats] = field(default_factory=dict)  # instance → its last PoolStats
    pending: dict[str, list[PoolStats]] = field(default_factory=dict)  # instance → since the last evaluation
    evaluated_at_ms: int | None = None


def _weighted_median(values: list[tuple[float, int]]) -> float | None:
    """The value below which half the weight lies; None without weight."""
    ranked = sorted((v, w) for v, w in values if w > 0)
    total = sum(w for _, w in ranked)
    if not total:
        return None
    seen = 0
    for value, weight in ranked:
        seen += weight
        if 2 * seen >= total:
            return value
    return ranked[-1][0]


def _max(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _one_instance(windows: list[PoolStats]) -> PoolStats:
    """One instance's consecutive windows as one (they follow each other, so counts add)."""
    if len(windows) == 1:
        return windows[0]
    last = windows[-1]
    placed = sum(w.placed for w in windows)
    completed = sum(w.completed for w in windows)
    service = [(w.service_ms_mean, w.completed) for w in windows if w.service_ms_mean is not None and w.completed]
    return last.model_copy(
        update={
            "window_start_ms": windows[0].window_start_ms,
            "window_s": sum(w.window_s for w in windows),
            "arrivals": sum(w.arrivals for w in windows),
            "placed": placed,
            "completed": completed,
            "queue_wait_ms_p50": _weighted_median(
                [(w.queue_wait_ms_p50, w.placed) for w in windows if w.queue_wait_ms_p50 is not None]
            ),
            "queue_wait_ms_p90": _max([w.queue_wait_ms_p90 for w in windows]),
            "queue_wait_ms_p99": _max([w.queue_wait_ms_p99 for w in windows]),
            "queue_wait_ms_max": _max([w.queue_wait_ms_max for w in windows]),
            "service_ms_mean": sum(m * n for m, n in service) / sum(n for _, n in service) if service else None,
            "arrival_prompt_tokens": sum(w.arrival_prompt_tokens for w in windows),
            "completion_tokens": sum(w.completion_tokens for w in windows),
        }
    )


def merge_pool_stats(windows: dict[str, list[PoolStats]], gauges: dict[str, PoolStats]) -> PoolStats:
    """Counts from `windows` (instance → windows since the last evaluation), gauges from `gauges`
    (instance → its latest PoolStats, every live instance). Both name one pool."""
    per_instance = [_one_instance(ws) for ws in windows.values() if ws]
    latest = list(gauges.values())
    freshest = max(latest, key=lambda s: s.sent_at_ms)
    service = [(s.service_ms_mean, s.completed) for s in per_instance if s.service_ms_mean is not None and s.completed]
    return PoolStats(
        pool=freshest.pool,
        instance_id="+".join(sorted(set(windows) | set(gauges))),
        window_start_ms=min((s.window_start_ms for s in per_instance), default=freshest.sent_at_ms),
        window_s=statistics.fmean(s.window_s for s in per_instance) if per_instance else 0.0,
        arrivals=sum(s.arrivals for s in per_instance),
        placed=sum(s.placed for s in per_instance),
        completed=sum(s.completed for s in per_instance),
        queue_wait_ms_p50=_weighted_median(
            [(s.queue_wait_ms_p50, s.placed) for s in per_instance if s.queue_wait_ms_p50 is not None]
        ),
        queue_wait_ms_p90=_max([s.queue_wait_ms_p90 for s in per_instance]),
        queue_wait_ms_p99=_max([s.queue_wait_ms_p99 for s in per_instance]),
        queue_wait_ms_max=_max([s.queue_wait_ms_max for s in per_instance]),
        service_ms_mean=sum(m * n for m, n in service) / sum(n for _, n in service) if service else None,
        queued=sum(s.queued for s in latest),
        oldest_wait_ms=max(s.oldest_wait_ms for s in latest),
        in_flight=sum(s.in_flight for s in latest),
        workers_ready=freshest.workers_ready,
        workers_warming=freshest.workers_warming,
        workers_draining=freshest.workers_draining,
        kv_cache_usage_perc_mean=freshest.kv_cache_usage_perc_mean,
        kv_cache_usage_perc_max=freshest.kv_cache_usage_perc_max,
        arrival_prompt_tokens=sum(s.arrival_prompt_tokens for s in per_instance),
        completion_tokens=sum(s.completion_tokens for s in per_instance),
        latency_window_s=freshest.latency_window_s,
        ttft_samples=sum(s.ttft_samples for s in latest),
        ttft_ms_p50=_weighted_median([(s.ttft_ms_p50, s.ttft_samples) for s in latest if s.ttft_ms_p50 is not None]),
        ttft_ms_p90=_max([s.ttft_ms_p90 for s in latest]),
        ttft_ms_p99=_max([s.ttft_ms_p99 for s in latest]),
        tpot_ms_p50=_weighted_median([(s.tpot_ms_p50, s.ttft_samples) for s in latest if s.tpot_ms_p50 is not None]),
        tpot_ms_p99=_max([s.tpot_ms_p99 for s in latest]),
        prefill_backlog_tokens=max(s.prefill_backlog_tokens for s in latest),
        sent_at_ms=freshest.sent_at_ms,
        release=freshest.release or next((s.release for s in latest if s.release is not None), None),
    )


@dataclass
class PoolStatsMerger:
    stale_s: float = 15.0  # an instance silent this long no longer counts
    max_wait_s: float = 7.5  # evaluate at the latest this long after the last evaluation, late instances or not
    _pools: dict[str, _PoolRound] = field(default_factory=dict)

    def add(self, stats: PoolStats) -> PoolStats | None:
        """Take one instance's statistics; the pool's merged statistics when an evaluation is due."""
        pool = self._pools.setdefault(stats.pool, _PoolRound())
        instance = stats.instance_id
        previous = pool.latest.get(instance)
        if previous is not None and stats.sent_at_ms <= previous.sent_at_ms:
            return None  # a window already taken, redelivered
        pool.latest[instance] = stats
        pool.pending.setdefault(instance, []).append(stats)
        now = stats.sent_at_ms
        for name in [n for n, s in pool.latest.items() if now - s.sent_at_ms > self.stale_s * 1000]:
            del pool.latest[name]
            pool.pending.pop(name, None)
        everyone = set(pool.latest) <= set(pool.pending)
        waited_s = (now - pool.evaluated_at_ms) / 1000 if pool.evaluated_at_ms is not None else None
        if not everyone and (waited_s is None or waited_s < self.max_wait_s):
            return None
        merged = merge_pool_stats(pool.pending, pool.latest)
        pool.pending = {}
        pool.evaluated_at_ms = now
        return merged

    def instances(self, pool: str) -> list[str]:
        round_ = self._pools.get(pool)
        return sorted(round_.latest) if round_ is not None else []
