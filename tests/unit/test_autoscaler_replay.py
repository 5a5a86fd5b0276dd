"""The tidal-day replay (bench/autoscaler_replay.py) on a short step of load: real scheduler core and
policies, modelled workers with a cold start; everything is served and the pool follows the load."""

from __future__ import annotations

import random

from bench.autoscaler_replay import Arrival, ReplayConfig, replay_day
from llmbus_services.autoscaler.core import Bounds
from llmbus_services.autoscaler.core.predictive import PredictivePolicy
from llmbus_services.autoscaler.core.threshold import ThresholdPolicy
from llmbus_services.engine_worker.adapters.engines.sim.profiles import get_profile


def step_load() -> list[Arrival]:
    """0.2/s for 10 min, 2/s for 10 min, then nothing for 30 min."""
    rng = random.Random(1)
    out, t = [], 0.0
    while t < 3000:
        rate = 2.0 if 600 <= t < 1200 else (0.2 if t < 600 else 0.0)
        if rate == 0:
            break
        t += rng.expovariate(rate)
        out.append(Arrival(t * 1000, rng.randint(100, 800), rng.randint(50, 200)))
    return out


def test_policies_follow_a_step_and_serve_everything() -> None:
    arrivals = step_load()
    profile = get_profile("llama-3.1-8b-a100")
    cfg = ReplayConfig(slots=4, cold_start_s=20)
    day_ms = 3000 * 1000.0
    predictive = PredictivePolicy(Bounds(1, 10), max_utilisation=0.7, down_after_s=60, idle_after_s=300)
    threshold = ThresholdPolicy(Bounds(1, 10), up_after_s=30, cooldown_s=60, idle_after_s=300)
    res_p = replay_day(arrivals, profile, cfg, predictive, day_ms=day_ms)
    res_t = replay_day(arrivals, profile, cfg, threshold, day_ms=day_ms)
    res_s = replay_day(arrivals, profile, cfg, None, static_replicas=1, day_ms=day_ms)
    for res in (res_p, res_t, res_s):
        assert res.unserved == 0 and len(res.ttft_ms) == len(arrivals)
    peak_p = max(n for _, n, _, _ in res_p.timeline)
    assert peak_p >= 2  # 2/s x ~2.3 s of service needs more than one 4-slot worker
    assert res_p.timeline[-1][1] == 1  # back to the minimum once the load is gone
    assert res_p.scale_events >= 2 and res_p.cold_start_gpu_hours > 0
    # one static worker drowns; scaling keeps most first tokens within 2 s
    within = lambda res: sum(1 for x in res.ttft_ms if x <= 2000) / len(arrivals)  # noqa: E731
    assert within(res_s) < 0.5 < 0.99 < within(res_p)
    assert within(res_t) > within(res_s)
