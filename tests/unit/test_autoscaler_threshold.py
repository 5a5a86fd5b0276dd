"""The threshold policy (the design source's rule with its latency trigger) in virtual time: sustained
queue wait or sustained p99 TTFT → up, cooldown, min/max, the zero-traffic timer, waking from zero."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmbus_services.autoscaler.core import Bounds, PoolSignals
from llmbus_services.autoscaler.core.config import PoolsFile
from llmbus_services.autoscaler.core.policies import ThresholdParams, ThresholdPolicy
from tests.unit.policy_driver import run, sig


def slow(t_s: float, ttft_ms: float = 5000, samples: int = 50, **kw: object) -> PoolSignals:
    """Requests placed at once (queue wait 20 ms) whose first token comes late: they wait in the engine."""
    return sig(t_s, 20, arrivals=10, ttft_ms_p99=ttft_ms, ttft_samples=samples, **kw)


def threshold(bounds: Bounds, **params: object) -> ThresholdPolicy:
    return ThresholdPolicy(bounds, ThresholdParams.model_validate(params))


def test_scales_up_only_after_three_sustained_minutes_of_queue_wait() -> None:
    policy = threshold(Bounds(1, 5))
    _, changes = run(policy, 1, 0, 179, lambda t: sig(t, 800, arrivals=10))
    assert changes == []
    _, changes = run(policy, 1, 180, 200, lambda t: sig(t, 800, arrivals=10))
    assert changes == [(180, 1, 2)]


def test_a_dip_in_queue_wait_restarts_the_timer() -> None:
    policy = threshold(Bounds(1, 5))
    # 2.5 min high, one window under target, 2.5 min high again: never 3 min in a row.
    waits = lambda t: sig(t, 100 if 150 <= t < 155 else 800, arrivals=10)  # noqa: E731
    _, changes = run(policy, 1, 0, 300, waits)
    assert changes == []
    _, changes = run(policy, 1, 300, 340, waits)
    assert changes == [(335, 1, 2)]  # 155 + 180


def test_latency_trigger_scales_up_while_queue_wait_stays_low() -> None:
    """Prefill-heavy load: every request is placed at once (20 ms) and waits inside the engine behind
    other prompts' prefill; only the p99 TTFT over the tier's target, for 3 minutes, shows it."""
    policy = threshold(Bounds(1, 5))
    _, changes = run(policy, 1, 0, 179, slow)
    assert changes == []
    d = policy.decide(slow(180), 1)
    assert d.desired_replicas == 2 and "p99 TTFT 5000 ms > 2000 ms for 180s" in d.reason
    assert "queue wait" not in d.reason and d.signals["ttft_ms_p99"] == 5000 and d.signals["queue_wait_ms"] == 20
    # without the latency trigger (the design source's rule as it was) the same pool never scales
    blind = threshold(Bounds(1, 5), ttft_target_ms=None)
    _, changes = run(blind, 1, 0, 1800, slow)
    assert changes == []


def test_latency_windows_with_too_few_finished_requests_keep_the_streak() -> None:
    """Bursts: a quiet window inside one (few requests finished) neither starts nor breaks the streak;
    a window whose p99 is within the target does break it."""
    policy = threshold(Bounds(1, 5), latency_up_after_s=60)
    lull = lambda t: slow(t, 100, samples=3) if 30 <= t < 45 else slow(t)  # noqa: E731
    _, changes = run(policy, 1, 0, 65, lull)
    assert changes == [(60, 1, 2)]
    policy = threshold(Bounds(1, 5), latency_up_after_s=60)
    dip = lambda t: slow(t, 1500) if t == 30 else slow(t)  # noqa: E731
    _, changes = run(policy, 1, 0, 100, dip)
    assert changes == [(95, 1, 2)]  # 35 + 60


def test_latency_clock_stops_while_a_worker_warms() -> None:
    policy = threshold(Bounds(1, 5), latency_up_after_s=30, cooldown_s=0)
    _, changes = run(policy, 1, 0, 35, slow)
    assert changes == [(30, 1, 2)]
    # the added worker warms for 90 s: TTFT stays high meanwhile, and that is the cold start's cost
    _, changes = run(policy, 2, 35, 125, lambda t: slow(t, workers_ready=1, workers_warming=1))
    assert changes == []
    _, changes = run(policy, 2, 125, 160, lambda t: slow(t, workers_ready=2))
    assert changes == [(155, 2, 3)]


def test_cooldown_spaces_changes_and_max_caps() -> None:
    policy = threshold(Bounds(1, 3), cooldown_s=300, step_up=1)
    replicas, changes = run(policy, 1, 0, 1800, lambda t: sig(t, 900, arrivals=10))
    assert [c[2] for c in changes] == [2, 3]
    assert changes[1][0] - changes[0][0] >= 300
    assert replicas == 3  # max holds however long the wait stays high


def test_zero_traffic_ten_minutes_goes_to_min_and_zero_wakes() -> None:
    policy = threshold(Bounds(0, 4), cooldown_s=300)
    replicas, changes = run(policy, 3, 0, 599, lambda t: sig(t))
    assert changes == [] and replicas == 3
    replicas, changes = run(policy, 3, 600, 610, lambda t: sig(t))
    assert changes == [(600, 3, 0)]
    # a request at zero: one worker at once, cooldown or not
    d = policy.decide(sig(620, queued=1, oldest_wait_ms=50), 0)
    assert d.desired_replicas == 1 and "cold start" in d.reason


def test_a_burst_that_ended_slow_at_max_still_goes_back_to_min() -> None:
    """The latency trigger held at max when the burst stopped: with no traffic, the window's old p99 (and
    then too few samples, which keep a streak inside a burst) must not keep the pool at max for good."""
    policy = threshold(Bounds(0, 2), latency_up_after_s=5, idle_after_s=20, cooldown_s=10)
    replicas, changes = run(policy, 1, 0, 30, lambda t: slow(t, workers_ready=1 if t <= 5 else 2))
    assert changes == [(5, 1, 2)] and replicas == 2  # then the trigger holds "at bound" until t = 25
    # traffic stops; for 60 s the scheduler's latency window still holds the burst's TTFTs, then too few
    stale = lambda t: sig(t, ttft_ms_p99=5000, ttft_samples=50, workers_ready=2) if t < 90 else sig(t, workers_ready=2)  # noqa: E731
    replicas, changes = run(policy, 2, 30, 120, stale)
    assert changes == [(45, 2, 0)] and replicas == 0  # 20 s after the last request (t = 25)


def test_does_not_wake_a_pool_that_static_workers_serve() -> None:
    """`make up`: two static workers serve the pool, the autoscaler has none of its own; a request
    (the demo) must not start a third worker for ten minutes."""
    policy = threshold(Bounds(0, 4))
    d = policy.decide(sig(0, 40, arrivals=1, workers_ready=2), 0)
    assert d.desired_replicas == 0, d.reason
    d = policy.decide(sig(5, arrivals=1, queued=1, oldest_wait_ms=50, workers_warming=1), 0)
    assert d.desired_replicas == 0, d.reason  # one is already coming up
    d = policy.decide(sig(10, arrivals=1, queued=1, oldest_wait_ms=50), 0)
    assert d.desired_replicas == 1 and "cold start" in d.reason


def test_counts_no_queue_wait_while_the_added_capacity_comes_up() -> None:
    """A pool woken from zero: the request waits out the cold start (process start, then warming,
    then its own placement at a 10 s wait); none of that is a reason for a second worker."""
    policy = threshold(Bounds(0, 4), target_queue_wait_ms=300, up_after_s=3, cooldown_s=4)
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


def test_a_worker_that_never_gets_ready_stops_holding_after_its_timeout() -> None:
    policy = threshold(Bounds(1, 4), up_after_s=3, cooldown_s=0, ready_timeout_s=30)
    assert policy.decide(sig(0, 900, arrivals=3, workers_ready=1), 1).desired_replicas == 1
    assert policy.decide(sig(3, 900, arrivals=3, workers_ready=1), 1).desired_replicas == 2
    held = [policy.decide(sig(t, 900, arrivals=3, workers_ready=1), 2).desired_replicas for t in range(4, 33)]
    assert set(held) == {2}  # the second never reports ready; its wait is held for 30 s
    after = [policy.decide(sig(t, 900, arrivals=3, workers_ready=1), 2).desired_replicas for t in (33, 34, 35, 36)]
    assert after == [2, 2, 2, 3]  # then a full `up_after_s` of wait adds the next


def test_idle_timer_restarts_with_traffic_and_respects_min() -> None:
    policy = threshold(Bounds(2, 4))
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


def test_pools_file_is_strict() -> None:
    spec = PoolsFile.load("default").pools["sim-llama-8b"]
    policy = spec.build_policy()
    assert policy.name == "threshold" and isinstance(policy, ThresholdPolicy)
    assert policy.params.ttft_target_ms == 2000 and policy.params.latency_up_after_s == 180
    assert PoolsFile.load("burst").pools["sim-llama-8b"].build_policy().name == "threshold"
    assert PoolsFile.load("predictive").pools["sim-llama-8b"].build_policy().name == "predictive"

    def pool(policy: dict[str, object], **bounds: int) -> dict[str, object]:
        return {"pools": {"p": {"policy": policy, **bounds}}}

    with pytest.raises(ValidationError, match="bogus"):
        PoolsFile.model_validate(pool({"type": "threshold", "params": {"bogus": 1}}))
    with pytest.raises(ValidationError, match="up_after_s"):  # a value of the wrong type is refused too
        PoolsFile.model_validate(pool({"type": "threshold", "params": {"up_after_s": "three minutes"}}))
    with pytest.raises(ValidationError, match="ttft_quantile"):
        PoolsFile.model_validate(pool({"type": "threshold", "params": {"ttft_quantile": "p95"}}))
    with pytest.raises(ValidationError, match="unknown scaling policy"):
        PoolsFile.model_validate(pool({"type": "magic"}))
    with pytest.raises(ValidationError, match="min_replicas"):
        PoolsFile.model_validate(pool({"type": "threshold"}, min_replicas=3, max_replicas=2))
