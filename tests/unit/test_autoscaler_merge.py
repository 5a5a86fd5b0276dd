"""Pool statistics of several scheduler instances merged per pool (services/autoscaler/core/merge.py)."""

from __future__ import annotations

import pytest

from llmbus.contract.messages import PoolStats
from llmbus_services.autoscaler.core.merge import PoolStatsMerger, merge_pool_stats


def stats(instance: str, sent_at_ms: int, window_s: float = 5.0, **fields: object) -> PoolStats:
    return PoolStats(
        pool="m",
        instance_id=instance,
        window_start_ms=sent_at_ms - int(window_s * 1000),
        window_s=window_s,
        sent_at_ms=sent_at_ms,
        **fields,  # type: ignore[arg-type]
    )


def test_counts_and_queues_add_up_the_tail_is_the_worst_and_the_fleet_is_the_freshest_view() -> None:
    a = stats(
        "a", 10_000, arrivals=30, placed=30, completed=28, queue_wait_ms_p50=100.0, queue_wait_ms_p99=400.0,
        queue_wait_ms_max=450.0, service_ms_mean=1000.0, queued=4, oldest_wait_ms=800.0, in_flight=12,
        workers_ready=3,
    )  # fmt: skip
    b = stats(
        "b", 10_200, arrivals=10, placed=10, completed=12, queue_wait_ms_p50=900.0, queue_wait_ms_p99=2000.0,
        queue_wait_ms_max=2100.0, service_ms_mean=2000.0, queued=6, oldest_wait_ms=1500.0, in_flight=5,
        workers_ready=4,
    )  # fmt: skip
    merged = merge_pool_stats({"a": [a], "b": [b]}, {"a": a, "b": b})
    assert merged.instance_id == "a+b"
    assert (merged.arrivals, merged.placed, merged.completed) == (40, 40, 40)
    assert merged.window_s == 5.0  # so arrivals / window_s = 6 + 2 per second, the sum of the two rates
    assert (merged.queued, merged.in_flight, merged.oldest_wait_ms) == (10, 17, 1500.0)
    # The median of 40 placements, 30 of them at a's median: a's. The tail: b's, the worst.
    assert merged.queue_wait_ms_p50 == 100.0
    assert (merged.queue_wait_ms_p99, merged.queue_wait_ms_max) == (2000.0, 2100.0)
    assert merged.service_ms_mean == pytest.approx((28 * 1000 + 12 * 2000) / 40)
    assert merged.workers_ready == 4 and merged.sent_at_ms == 10_200


def test_the_median_follows_the_instance_that_placed_most() -> None:
    a = stats("a", 5_000, placed=3, queue_wait_ms_p50=50.0)
    b = stats("b", 5_000, placed=20, queue_wait_ms_p50=700.0)
    idle = stats("c", 5_000)  # placed nothing: no wait to weigh
    assert merge_pool_stats({"a": [a], "b": [b], "c": [idle]}, {"a": a, "b": b, "c": idle}).queue_wait_ms_p50 == 700.0
    assert merge_pool_stats({"c": [idle]}, {"c": idle}).queue_wait_ms_p50 is None


def test_one_instance_is_evaluated_on_every_report_unchanged() -> None:
    merger = PoolStatsMerger()
    first = stats("a", 5_000, arrivals=3, queued=1)
    merged = merger.add(first)
    assert merged is not None and merged.arrivals == 3 and merged.queued == 1 and merged.instance_id == "a"
    assert merger.add(stats("a", 10_000, arrivals=4)) is not None


def test_two_instances_are_evaluated_once_per_round_with_both_counted_not_the_last_one() -> None:
    merger = PoolStatsMerger()
    assert merger.add(stats("a", 5_000, arrivals=10, queued=2)) is not None  # a alone so far
    assert merger.add(stats("b", 5_100, arrivals=7, queued=3)) is None  # b joins: wait for a's next
    merged = merger.add(stats("a", 10_000, arrivals=11, queued=1))
    assert merged is not None
    assert merged.arrivals == 18 and merged.queued == 4  # b's 7 + a's 11; b's 3 waiting + a's 1
    assert merger.instances("m") == ["a", "b"]
    # The next round: b first, then a; nothing is counted twice.
    assert merger.add(stats("b", 10_100, arrivals=5, queued=0)) is None
    merged = merger.add(stats("a", 15_000, arrivals=6, queued=0))
    assert merged is not None and merged.arrivals == 11


def test_an_instance_that_reports_twice_in_a_round_has_both_windows_counted() -> None:
    merger = PoolStatsMerger(max_wait_s=60)
    merger.add(stats("a", 5_000))
    merger.add(stats("b", 5_000))
    assert merger.add(stats("a", 10_000)) is not None  # both known, both reported
    assert merger.add(stats("a", 15_000, arrivals=5, placed=5, queue_wait_ms_p50=100.0)) is None
    assert merger.add(stats("a", 20_000, arrivals=5, placed=15, queue_wait_ms_p50=300.0)) is None
    merged = merger.add(stats("b", 20_000, arrivals=2))
    assert merged is not None
    assert merged.arrivals == 12 and merged.placed == 20
    assert merged.window_s == 7.5  # a's 10 s and b's 5 s: the mean, 12 / 7.5 ≈ a's 1/s + b's 0.4/s
    assert merged.queue_wait_ms_p50 == 300.0


def test_a_late_instance_is_waited_for_at_most_max_wait_and_a_silent_one_is_dropped() -> None:
    merger = PoolStatsMerger(max_wait_s=7.5, stale_s=15)
    merger.add(stats("a", 5_000, queued=1))
    merger.add(stats("b", 5_000, queued=2))
    assert merger.add(stats("a", 10_000, queued=1)) is not None  # round a+b complete
    assert merger.add(stats("a", 15_000, queued=1)) is None  # b is late: 5 s since the last evaluation
    merged = merger.add(stats("a", 20_000, queued=1))  # 10 s > 7.5 s: evaluate without b's new report
    assert merged is not None and merged.queued == 3  # b's last known queue still counts
    merged = merger.add(stats("a", 25_000, queued=1))  # b silent for 20 s > 15 s: gone
    assert merged is not None and merged.queued == 1 and merger.instances("m") == ["a"]


def test_a_redelivered_window_is_not_counted_again() -> None:
    merger = PoolStatsMerger()
    merger.add(stats("a", 5_000))
    merger.add(stats("b", 5_000))
    window = stats("a", 10_000, arrivals=9)
    merged = merger.add(window)
    assert merged is not None and merged.arrivals == 9
    assert merger.add(window) is None  # delivered again after a rebalance: already taken
    assert merger.add(stats("b", 10_000, arrivals=1)) is None
    merged = merger.add(stats("a", 15_000, arrivals=2))
    assert merged is not None and merged.arrivals == 3


def test_latency_tokens_and_backlog_merge_tail_as_the_worst_and_counts_as_sums() -> None:
    """TTFT windows are each instance's own finished requests: the median weighted by samples, the tail the
    worst; token counts add up; the backlog (every instance sees the fleet's heartbeats) is the largest."""
    a = stats(
        "a", 10_000, arrivals=10, arrival_prompt_tokens=20_000, completed=8, completion_tokens=240, ttft_samples=30,
        ttft_ms_p50=400.0, ttft_ms_p99=1800.0, tpot_ms_p99=40.0, prefill_backlog_tokens=12_000,
        kv_cache_usage_perc_max=0.3,
    )  # fmt: skip
    b = stats(
        "b", 10_200, arrivals=5, arrival_prompt_tokens=9_000, completed=4, completion_tokens=120, ttft_samples=10,
        ttft_ms_p50=3000.0, ttft_ms_p99=6000.0, tpot_ms_p99=30.0, prefill_backlog_tokens=15_000,
        kv_cache_usage_perc_max=0.5,
    )  # fmt: skip
    merged = merge_pool_stats({"a": [a], "b": [b]}, {"a": a, "b": b})
    assert (merged.arrival_prompt_tokens, merged.completion_tokens, merged.ttft_samples) == (29_000, 360, 40)
    assert merged.ttft_ms_p50 == 400.0 and merged.ttft_ms_p99 == 6000.0 and merged.tpot_ms_p99 == 40.0
    assert merged.prefill_backlog_tokens == 15_000 and merged.kv_cache_usage_perc_max == 0.5  # b is the freshest
    # two windows of one instance: their tokens add up too
    one = merge_pool_stats({"a": [a, stats("a", 15_000, arrivals=1, arrival_prompt_tokens=100)]}, {"a": a})
    assert one.arrival_prompt_tokens == 20_100
