"""The day replay (bench/autoscaler_replay.py) on a short prefill-heavy step of load: real scheduler core
and policies, engines modelled step for step, workers with a cold start. The load swamps one worker's
prefill while its batch slots stay free, so requests are placed at once and wait inside the engine:
queue wait stays low, TTFT does not, and the policies must scale on the latency signal."""

from __future__ import annotations

import random

from bench.autoscaler_replay import Arrival, DayResult, ReplayConfig, replay_day
from llmbus_services.autoscaler.core import Bounds
from llmbus_services.autoscaler.core.policies import (
    PredictiveParams,
    PredictivePolicy,
    ThresholdParams,
    ThresholdPolicy,
)
from llmbus_services.autoscaler.core.sizing import EngineModel
from llmbus_services.engine_worker.adapters.engines.sim.profiles import get_profile

PROFILE = get_profile("llama-3.3-70b-h100-tp4")  # 3,000 prompt tokens: 0.23 s of prefill each


def step_load() -> list[Arrival]:
    """0.5/s for 10 min, 5/s for 10 min (1.15 s of prefill a second: more than one worker has), then nothing."""
    rng = random.Random(1)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(5.0 if 600 <= t < 1200 else 0.5)
        if t >= 1200:
            return out
        out.append(Arrival(t * 1000, rng.randint(2000, 4000), rng.randint(10, 40)))


def within(res: DayResult, n: int) -> float:
    return sum(1 for x in res.ttft_ms if x <= 2000) / n


def test_policies_scale_on_ttft_while_queue_wait_stays_low_and_serve_everything() -> None:
    arrivals = step_load()
    cfg = ReplayConfig(cold_start_s=20)
    day_ms = 2400 * 1000.0
    engine = EngineModel(
        step_base_us=PROFILE.step_base_us,
        prefill_us_per_token=PROFILE.prefill_us_per_token,
        decode_us_per_seq=PROFILE.decode_us_per_seq,
    )
    fast = {"down_after_s": 60, "down_hold_cold_starts": 3, "idle_after_s": 300, "default_cold_start_s": 20}
    predictive = PredictivePolicy(Bounds(1, 10), PredictiveParams.model_validate({"engine": engine} | fast))
    threshold = ThresholdPolicy(
        Bounds(1, 10), ThresholdParams(up_after_s=30, latency_up_after_s=30, cooldown_s=30, idle_after_s=300)
    )
    res_p = replay_day(arrivals, PROFILE, cfg, predictive, day_ms=day_ms)
    res_t = replay_day(arrivals, PROFILE, cfg, threshold, day_ms=day_ms)
    res_s = replay_day(arrivals, PROFILE, cfg, None, static_replicas=1, day_ms=day_ms)
    for res in (res_p, res_t, res_s):
        assert res.unserved == 0 and len(res.ttft_ms) == len(arrivals)
    # one worker: TTFT is over target minutes before queue wait moves (requests placed at once wait in the
    # engine behind each other's prefill; only when they fill its 256 batch slots does the queue grow)
    first_slow = min(t for t, _, _, _, ttft, _ in res_s.timeline if ttft > 2000)
    first_wait = min(t for t, _, _, wait, _, _ in res_s.timeline if wait > 300)
    assert 600 <= first_slow < first_wait - 120, (first_slow, first_wait)
    # the threshold policy scales on its latency trigger alone, and the queue wait it never saw stays low
    ups = [d for d in res_t.decisions if d["to"] > d["from"]]
    assert len(ups) >= 2 and all("p99 TTFT" in d["reason"] and "queue wait" not in d["reason"] for d in ups)
    assert max(wait for _, _, _, wait, _, _ in res_t.timeline) < 300
    # predictive sizes the prefill work: more than one worker at the step, back to the minimum after
    assert max(n for _, n, *_ in res_p.timeline) >= 2
    assert res_p.timeline[-1][1] == 1 and res_t.timeline[-1][1] == 1
    assert res_p.scale_events >= 2 and res_p.cold_start_gpu_hours > 0
    # one static worker drowns; scaling keeps most first tokens within 2 s
    n = len(arrivals)
    assert within(res_s, n) < 0.5 < within(res_t, n)
    assert within(res_p, n) > 0.8
