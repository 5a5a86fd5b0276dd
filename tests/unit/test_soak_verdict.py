"""The soak's verdict: memory judged after the warm-up, where time-bounded caches have filled."""

from __future__ import annotations

from bench.reliability_soak import judge


def run_of(
    rss: list[float],
    minutes: float = 30.0,
    sample_s: float = 10.0,
    lag: int = 0,
    http_lost: int = 0,
    billing_problems: tuple[str, ...] = (),
) -> dict:
    samples = [{"t_s": i * sample_s, "rss_mib": {"scheduler": v}, "lag": {}} for i, v in enumerate(rss)]
    return {
        "minutes": minutes,
        "samples": samples,
        "audit": {"passed": True},
        "final_lag": {"g": lag},
        "http": {"sent": 100, "complete": 100 - http_lost, "lost": http_lost},
        "billing": {"problems": list(billing_problems)},
    }


def ramp_then_flat(ramp_s: float, total_s: float, start: float, end: float) -> list[float]:
    n, ramp = int(total_s / 10), int(ramp_s / 10)
    return [start + (end - start) * min(i, ramp) / ramp for i in range(n + 1)]


def test_a_cache_that_fills_for_ten_minutes_and_holds_passes() -> None:
    # The soak's scheduler: 70 → 107 MiB over the prefix index's 10 minutes, then flat.
    verdict = judge(run_of(ramp_then_flat(600, 1800, 70, 107)), warmup_min=12)
    assert verdict["passed"] and verdict["rss_growth"]["scheduler"] == 0.0


def test_growth_that_goes_on_after_the_warm_up_fails() -> None:
    verdict = judge(run_of(ramp_then_flat(1800, 1800, 70, 140)), warmup_min=12)
    assert not verdict["passed"] and verdict["rss_growth"]["scheduler"] > 0.10


def test_the_warm_up_is_at_least_a_fifth_of_the_run_and_a_short_run_is_not_judged() -> None:
    long = judge(run_of(ramp_then_flat(600, 7200, 70, 107), minutes=120), warmup_min=12)
    assert long["warmup_s"] == 1440 and long["passed"]
    short = judge(run_of(ramp_then_flat(600, 720, 70, 107), minutes=12), warmup_min=12)
    assert short["rss_growth"]["scheduler"] is None and not short["memory_judged"] and not short["passed"]


def test_lag_left_after_the_load_fails() -> None:
    assert not judge(run_of([80.0] * 181, lag=3), warmup_min=12)["passed"]


def test_a_lost_http_request_or_a_billing_problem_fails() -> None:
    flat = [80.0] * 181
    assert judge(run_of(flat), warmup_min=12)["passed"]
    assert not judge(run_of(flat, http_lost=1), warmup_min=12)["passed"]
    assert not judge(run_of(flat, billing_problems=("1 result billed twice",)), warmup_min=12)["passed"]


def test_a_run_saved_without_http_or_billing_fails() -> None:
    """Reports from before the gateway and cost-accounting were in the soak measured neither."""
    old = run_of([80.0] * 181)
    del old["http"], old["billing"]
    assert not judge(old, warmup_min=12)["passed"]
