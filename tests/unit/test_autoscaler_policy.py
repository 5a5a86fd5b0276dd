"""Scaling policies in virtual time: hysteresis, cooldown, min/max, zero-traffic timer, forecast."""

from __future__ import annotations

import itertools
import math

import pytest
from pydantic import ValidationError

from llmbus_services.autoscaler.core import Bounds, PoolSignals
from llmbus_services.autoscaler.core.config import PoolsFile
from llmbus_services.autoscaler.core.forecast import DAY_S, RateForecaster
from llmbus_services.autoscaler.core.predictive import PredictivePolicy
from llmbus_services.autoscaler.core.sizing import erlang_c_wait_s, replicas_for
from llmbus_services.autoscaler.core.threshold import ThresholdPolicy

STEP_S = 5


def sig(t_s: float, wait_ms: float | None = None, arrivals: int = 0, **kw: object) -> PoolSignals:
    return PoolSignals(
        pool="p",
        now_ms=int(t_s * 1000),
        window_s=STEP_S,
        arrivals=arrivals,
        queue_wait_ms_p50=wait_ms,
        **kw,  # type: ignore[arg-type]
    )


def run(policy, replicas: int, start_s: float, end_s: float, make) -> tuple[int, list[tuple[float, int, int]]]:  # type: ignore[no-untyped-def]
    """Drive a policy every STEP_S from start to end; apply each decision at once."""
    changes = []
    t = start_s
    while t < end_s:
        d = policy.decide(make(t), replicas)
        if d.desired_replicas != replicas:
            changes.append((t, replicas, d.desired_replicas))
            replicas = d.desired_replicas
        t += STEP_S
    return replicas, changes


def test_threshold_scales_up_only_after_three_sustained_minutes() -> None:
    policy = ThresholdPolicy(Bounds(1, 5))
    _, changes = run(policy, 1, 0, 179, lambda t: sig(t, 800, arrivals=10))
    assert changes == []
    _, changes = run(policy, 1, 180, 200, lambda t: sig(t, 800, arrivals=10))
    assert changes == [(180, 1, 2)]


def test_threshold_hysteresis_a_dip_restarts_the_timer() -> None:
    policy = ThresholdPolicy(Bounds(1, 5))
    # 2.5 min high, one window under target, 2.5 min high again: never 3 min in a row.
    waits = lambda t: sig(t, 100 if 150 <= t < 155 else 800, arrivals=10)  # noqa: E731
    _, changes = run(policy, 1, 0, 300, waits)
    assert changes == []
    _, changes = run(policy, 1, 300, 340, waits)
    assert changes == [(335, 1, 2)]  # 155 + 180


def test_threshold_cooldown_spaces_changes_and_max_caps() -> None:
    policy = ThresholdPolicy(Bounds(1, 3), cooldown_s=300, step_up=1)
    replicas, changes = run(policy, 1, 0, 1800, lambda t: sig(t, 900, arrivals=10))
    assert [c[2] for c in changes] == [2, 3]
    assert changes[1][0] - changes[0][0] >= 300
    assert replicas == 3  # max holds however long the wait stays high


def test_threshold_zero_traffic_ten_minutes_goes_to_min_and_zero_wakes() -> None:
    policy = ThresholdPolicy(Bounds(0, 4), cooldown_s=300)
    replicas, changes = run(policy, 3, 0, 599, lambda t: sig(t))
    assert changes == [] and replicas == 3
    replicas, changes = run(policy, 3, 600, 610, lambda t: sig(t))
    assert changes == [(600, 3, 0)]
    # a request at zero: one worker at once, cooldown or not
    d = policy.decide(sig(620, queued=1, oldest_wait_ms=50), 0)
    assert d.desired_replicas == 1 and "cold start" in d.reason


def test_threshold_does_not_wake_a_pool_that_static_workers_serve() -> None:
    """`make up`: two static workers serve the pool, the autoscaler has none of its own; a request
    (the demo) must not start a third worker for ten minutes."""
    policy = ThresholdPolicy(Bounds(0, 4))
    d = policy.decide(sig(0, 40, arrivals=1, workers_ready=2), 0)
    assert d.desired_replicas == 0, d.reason
    d = policy.decide(sig(5, arrivals=1, queued=1, oldest_wait_ms=50, workers_warming=1), 0)
    assert d.desired_replicas == 0, d.reason  # one is already coming up
    d = policy.decide(sig(10, arrivals=1, queued=1, oldest_wait_ms=50), 0)
    assert d.desired_replicas == 1 and "cold start" in d.reason


def test_predictive_does_not_wake_a_pool_that_static_workers_serve() -> None:
    policy = PredictivePolicy(Bounds(0, 4))
    d = policy.decide(sig(0, 40, arrivals=1, workers_ready=2), 0)
    assert d.desired_replicas == 0, d.reason
    # the static workers are gone: the same traffic now needs one of the pool's own
    d = policy.decide(sig(5, arrivals=1, queued=1, oldest_wait_ms=50), 0)
    assert d.desired_replicas == 1, d.reason


def test_threshold_counts_no_queue_wait_while_the_added_capacity_comes_up() -> None:
    """A pool woken from zero: the request waits out the cold start (process start, then warming,
    then its own placement at a 10 s wait); none of that is a reason for a second worker."""
    policy = ThresholdPolicy(Bounds(0, 4), target_queue_wait_ms=300, up_after_s=3, cooldown_s=4)
    assert policy.decide(sig(0, queued=1, oldest_wait_ms=50), 0).desired_replicas == 1
    waiting = dict(queued=1, arrivals=0)
    timeline = [sig(t, oldest_wait_ms=1000 * t, **waiting) for t in (1, 2, 3)]  # no heartbeat yet
    timeline += [sig(t, oldest_wait_ms=1000 * t, workers_warming=1, **waiting) for t in (4, 5, 6, 7, 8)]
    timeline += [sig(9, 9000, arrivals=0, workers_ready=1)]  # placed after 9 s
    timeline += [sig(10, arrivals=0, in_flight=1, workers_ready=1)]  # served: nothing waits
    for s in timeline:
        d = policy.decide(s, 1)
        assert d.desired_replicas == 1, (s.now_ms, d.reason)
    # the one worker then falls behind for real: sustained wait with nothing coming → up
    for t in (11, 12, 13):
        assert policy.decide(sig(t, 900, arrivals=3, workers_ready=1), 1).desired_replicas == 1
    d = policy.decide(sig(14, 900, arrivals=3, workers_ready=1), 1)
    assert d.desired_replicas == 2 and "median queue wait" in d.reason


def test_threshold_a_worker_that_never_gets_ready_stops_holding_after_its_timeout() -> None:
    policy = ThresholdPolicy(Bounds(1, 4), up_after_s=3, cooldown_s=0, ready_timeout_s=30)
    assert policy.decide(sig(0, 900, arrivals=3, workers_ready=1), 1).desired_replicas == 1
    assert policy.decide(sig(3, 900, arrivals=3, workers_ready=1), 1).desired_replicas == 2
    held = [policy.decide(sig(t, 900, arrivals=3, workers_ready=1), 2).desired_replicas for t in range(4, 33)]
    assert set(held) == {2}  # the second never reports ready; its wait is held for 30 s
    after = [policy.decide(sig(t, 900, arrivals=3, workers_ready=1), 2).desired_replicas for t in (33, 34, 35, 36)]
    assert after == [2, 2, 2, 3]  # then a full `up_after_s` of wait adds the next


def test_threshold_idle_timer_restarts_with_traffic_and_respects_min() -> None:
    policy = ThresholdPolicy(Bounds(2, 4))
    traffic = lambda t: sig(t, arrivals=1 if 300 <= t < 305 else 0)  # noqa: E731
    _, changes = run(policy, 4, 0, 899, traffic)
    assert changes == []  # 300 s of quiet, a request, then < 600 s of quiet
    _, changes = run(policy, 4, 900, 910, traffic)
    assert changes == [(900, 4, 2)]
    assert policy.decide(sig(2000), 2).desired_replicas == 2


def test_queue_wait_falls_back_to_oldest_waiter_when_nothing_is_placed() -> None:
    s = sig(0, None, queued=3, oldest_wait_ms=4000)
    assert s.queue_wait_ms == 4000
    assert sig(0, 120).queue_wait_ms == 120


def test_erlang_c_and_sizing() -> None:
    assert erlang_c_wait_s(1, 0.5, 1.0) == pytest.approx(1.0)  # M/M/1: rho/(mu-lambda) = 0.5/0.5
    assert math.isinf(erlang_c_wait_s(2, 3.0, 1.0))
    # 20 req/s x 4 s = 80 in service; 16 slots x 0.8 → at least 7 workers
    n = replicas_for(20.0, 4.0, 16, 0.3, 0.8, 50)
    assert n == 7
    assert erlang_c_wait_s(n * 16, 20.0, 4.0) <= 0.3
    assert replicas_for(20.0, 4.0, 16, 0.3, 0.8, 5) == 5
    assert replicas_for(0.0, 4.0, 16, 0.3, 0.8, 5) == 0


def test_forecast_follows_trend_and_daily_pattern() -> None:
    f = RateForecaster(level_half_life_s=30, trend_half_life_s=120)
    for i in range(120):  # a ramp: 0.1 → 12.1 req/s over 10 minutes
        f.observe(i * 5, int((0.1 + i * 0.1) * 5), 5)
    assert f.peak_rate_per_s(600, 120) > f.level_per_s  # type: ignore[operator]
    # one day of a square wave: 2/s except 10:00-12:00 at 8/s; the next morning at 9:50 the
    # forecast 10 minutes ahead sees the peak coming although the present rate is 2/s
    g = RateForecaster()
    for i in range(int(DAY_S // 60) + 590):
        t = i * 60.0
        hour = (t % DAY_S) / 3600
        g.observe(t, (8 if 10 <= hour < 12 else 2) * 60, 60)
    now = DAY_S + 9 * 3600 + 50 * 60
    assert g.rate_at(now, 0) == pytest.approx(2, rel=0.2)
    assert g.peak_rate_per_s(now, 900) > 6


def test_predictive_starts_one_cold_start_ahead_and_scales_down_late() -> None:
    bounds = Bounds(0, 20)
    policy = PredictivePolicy(bounds, slots_per_worker=16, default_cold_start_s=60, lead_s=30, pattern_bin_s=600)
    # yesterday: 4/s, with 16/s between 10:00 and 12:00
    for i in range(int(DAY_S // 60)):
        hour = (i * 60 / 3600) % 24
        policy.observe_history(i * 60.0, (16 if 10 <= hour < 12 else 4) * 60, 60)
    replicas = 3
    ups = []
    t = DAY_S + 9 * 3600
    while t < DAY_S + 10 * 3600:
        d = policy.decide(sig(t, 20, arrivals=20, completed=20, service_ms_mean=4000, cold_start_s=60), replicas)
        if d.desired_replicas > replicas:
            ups.append(t)
        replicas = d.desired_replicas
        t += STEP_S
    # before 10:00 (the peak) the pool has grown, and not before the peak is within a cold start + ~1 bin
    assert ups and replicas >= replicas_for(16, 4, 16, 0.3, 0.8, 20) - 1
    assert min(ups) >= DAY_S + 9 * 3600 + 30 * 60
    # traffic stops: capacity stays for down_after_s, then goes; zero only after idle_after_s
    d = policy.decide(sig(t, arrivals=0, cold_start_s=60), replicas)
    assert d.desired_replicas == replicas
    changes = []
    while t < DAY_S + 10 * 3600 + 1200:
        t += STEP_S
        d = policy.decide(sig(t, arrivals=0, cold_start_s=60), replicas)
        if d.desired_replicas != replicas:
            changes.append((t - DAY_S - 10 * 3600, d.desired_replicas))
        replicas = d.desired_replicas
    assert changes and changes[0][0] >= policy.down_after_s
    assert replicas == 0


def test_predictive_adds_a_worker_only_on_a_sustained_queue_wait() -> None:
    policy = PredictivePolicy(Bounds(1, 4), slots_per_worker=64)  # wait_up_after_s 30
    waiting = lambda t: sig(t, 900, arrivals=1, completed=1, service_ms_mean=1000)  # noqa: E731
    # one window above target is noise (the old rule added a worker on it, then one every 5 s)
    assert policy.decide(waiting(0), 1).desired_replicas == 1
    _, changes = run(policy, 1, STEP_S, 60, waiting)
    assert changes[0] == (30, 1, 2)
    # a wait that falls back under target restarts the timer
    policy = PredictivePolicy(Bounds(1, 4), slots_per_worker=64)  # wait_up_after_s 30
    dip = lambda t: sig(t, 100 if t == 20 else 900, arrivals=1, completed=1, service_ms_mean=1000)  # noqa: E731
    _, changes = run(policy, 1, 0, 60, dip)
    assert changes == [(55, 1, 2)]


def test_predictive_adds_no_worker_for_queue_wait_while_one_is_warming() -> None:
    policy = PredictivePolicy(Bounds(1, 8), slots_per_worker=64, wait_up_after_s=10)
    # the worker added at 10 s warms for a minute: the wait it will absorb adds nobody more
    warming_until_s = 70.0
    replicas = 1
    ups = []
    for t in range(0, 120, STEP_S):
        warming = int(replicas > 1 and t < warming_until_s)
        d = policy.decide(sig(t, 900, arrivals=1, completed=1, service_ms_mean=1000, workers_warming=warming), replicas)
        if d.desired_replicas > replicas:
            ups.append((t, d.desired_replicas))
        replicas = d.desired_replicas
    # old rule: +1 in every window (2, 3, 4, ... 8 within 40 s); now one, and the next only once the wait
    # has lasted `wait_up_after_s` with nothing warming
    assert ups[0] == (10, 2) and ups[1][0] >= warming_until_s + 10
    assert all(b - a >= 15 for (a, _), (b, _) in itertools.pairwise(ups))


def test_predictive_sizes_work_in_flight_at_full_slots() -> None:
    """3 requests in flight on one 4-slot worker is not a reason for a second (it was, at the 0.7 cap:
    the rule behind most of the old policy's flapping)."""
    policy = PredictivePolicy(Bounds(1, 4), slots_per_worker=4, max_utilisation=0.7)
    quiet = dict(arrivals=1, completed=1, service_ms_mean=4000)
    assert policy.decide(sig(0, 10, in_flight=3, **quiet), 1).desired_replicas == 1
    assert policy.decide(sig(5, 10, in_flight=6, **quiet), 1).desired_replicas == 2
    strict = PredictivePolicy(Bounds(1, 4), slots_per_worker=4, max_utilisation=0.7, in_flight_utilisation=0.7)
    assert strict.decide(sig(0, 10, in_flight=3, **quiet), 1).desired_replicas == 2


def test_predictive_sizes_a_backlog_only_when_it_outlives_a_window() -> None:
    policy = PredictivePolicy(Bounds(1, 8), slots_per_worker=4, max_utilisation=0.7)
    full = dict(arrivals=1, completed=1, service_ms_mean=4000, in_flight=4)
    # one full worker and 8 waiting for one window: noise (the old rule: 2 workers for 4 in flight)
    assert policy.decide(sig(0, 10, queued=8, **full), 1).desired_replicas == 1
    d = policy.decide(sig(5, 10, queued=8, **full), 1)  # still waiting: 4 + 8 need three 4-slot workers
    assert d.desired_replicas == 3 and "waiting for two windows" in d.reason
    assert policy.decide(sig(10, 10, queued=0, **full), 3).desired_replicas == 3  # held, not dropped


def steady(rate_per_s: float) -> object:
    """Arrivals at a steady rate, 1 s of service each, nothing waiting."""
    return lambda t: sig(t, 10, arrivals=int(rate_per_s * STEP_S), completed=1, service_ms_mean=1000, cold_start_s=60)


def test_predictive_hysteresis_band_holds_a_size_the_lower_band_still_needs() -> None:
    # 20/s x 1 s on 16-slot workers: 2 workers at the 0.8 cap, 3 at the 0.55 band
    assert replicas_for(20, 1, 16, 0.3, 0.8, 10) == 2 and replicas_for(20, 1, 16, 0.3, 0.55, 10) == 3
    policy = PredictivePolicy(Bounds(1, 10), slots_per_worker=16, max_utilisation=0.8)  # down_utilisation 0.55
    replicas, changes = run(policy, 3, 0, 3600, steady(20))
    assert replicas == 3 and changes == []  # the old policy went to 2 after 120 s
    # well below the band (8/s: 1 worker at 0.55) it does go down, after the hold, to the band's size
    replicas, changes = run(policy, 3, 3600, 7200, steady(8))
    assert replicas == 1 and changes[0][0] >= 3600 + 300


def test_predictive_scale_down_hold_is_counted_in_cold_starts() -> None:
    """The default hold is 5 cold starts (down_hold_cold_starts) where that is longer than down_after_s."""
    for cold_start_s, hold_s in ((60, 300), (200, 1000)):
        policy = PredictivePolicy(Bounds(1, 10), slots_per_worker=16, default_cold_start_s=cold_start_s)
        busy = lambda t: sig(t, 10, arrivals=100, completed=1, service_ms_mean=1000)  # noqa: E731
        replicas, _ = run(policy, 3, 0, 600, busy)
        _, changes = run(policy, replicas, 600, 3000, lambda t: sig(t, 10, arrivals=10))
        assert changes, cold_start_s
        first_down_after_s = changes[0][0] - 600
        assert hold_s <= first_down_after_s < hold_s + 120, (cold_start_s, changes)  # old: 120 s


def test_predictive_scales_down_to_the_largest_size_of_the_hold() -> None:
    """The scale-down goes to the largest size the band asked for over the hold, not the last window's."""
    policy = PredictivePolicy(Bounds(1, 10), slots_per_worker=16, default_cold_start_s=60)
    in_flight = lambda t: 40 if 3000 <= t < 3005 else 0  # noqa: E731
    make = lambda t: sig(t, 10, arrivals=5, completed=1, service_ms_mean=1000, in_flight=in_flight(t))  # noqa: E731
    _, changes = run(policy, 5, 2900, 3400, make)
    # 40 in flight needs 3 workers at full slots: at 3000 s the pool may only go down to 3
    assert changes == [(3200, 5, 3)]  # the hold began at 2900 s; the old policy went 5 → 1 at 3020 s


def test_predictive_band_must_sit_under_the_cap() -> None:
    with pytest.raises(ValueError, match="down_utilisation"):
        PredictivePolicy(Bounds(1, 4), max_utilisation=0.6, down_utilisation=0.7)
    with pytest.raises(ValueError, match="in_flight_utilisation"):
        PredictivePolicy(Bounds(1, 4), in_flight_utilisation=1.5)
    spec = {
        "type": "predictive",
        "params": {"down_utilisation": 0.5, "down_hold_cold_starts": 3, "wait_up_after_s": 20},
    }
    assert PoolsFile.model_validate({"pools": {"p": {"policy": spec}}}).pools["p"].build_policy().name == "predictive"


def test_pools_file_is_strict() -> None:
    spec = PoolsFile.load("default").pools["sim-llama-8b"]
    assert spec.build_policy().name == "threshold"
    assert PoolsFile.load("predictive").pools["sim-llama-8b"].build_policy().name == "predictive"
    with pytest.raises(ValidationError, match="no parameter"):
        PoolsFile.model_validate({"pools": {"p": {"policy": {"type": "threshold", "params": {"bogus": 1}}}}})
    with pytest.raises(ValidationError, match="unknown policy"):
        PoolsFile.model_validate({"pools": {"p": {"policy": {"type": "magic"}}}})
    with pytest.raises(ValidationError, match="min_replicas"):
        PoolsFile.model_validate(
            {"pools": {"p": {"min_replicas": 3, "max_replicas": 2, "policy": {"type": "threshold"}}}}
        )
