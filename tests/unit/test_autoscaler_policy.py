"""Scaling policies in virtual time: hysteresis, cooldown, min/max, zero-traffic timer, forecast."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from services.autoscaler.policy import Bounds, PoolSignals
from services.autoscaler.policy.config import PoolsFile
from services.autoscaler.policy.forecast import DAY_S, RateForecaster
from services.autoscaler.policy.predictive import PredictivePolicy
from services.autoscaler.policy.sizing import erlang_c_wait_s, replicas_for
from services.autoscaler.policy.threshold import ThresholdPolicy

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


def test_predictive_reacts_when_queue_wait_exceeds_target() -> None:
    policy = PredictivePolicy(Bounds(1, 4), slots_per_worker=64)
    d = policy.decide(sig(0, 900, arrivals=1, completed=1, service_ms_mean=1000), 1)
    assert d.desired_replicas == 2 and "despite the forecast" in d.reason


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
