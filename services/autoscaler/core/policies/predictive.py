"""Scale ahead of the tide: forecast arrivals, size the pool by the work in tokens, start one cold start early.

Each evaluation:
1. the forecaster takes the window's arrivals (recent level + trend, and the daily pattern once a
   day has been seen) and gives the peak rate expected within one cold start plus `lead_s` — the
   earliest moment a worker started now could serve;
2. that rate, with the requests' mean prompt and output tokens and the prompts' burstiness (all
   learnt from the statistics, core/workload.py), is sized by the pool's engine model
   (core/sizing.py): the fewest workers that keep token work under `max_utilisation` of their
   engine time, the sequences decoding within their batch slots, and the requests whose window's
   prompts outrun the pool's prefill under `burst_late_share`;
3. the work already in the pool keeps what it needs — its prefill backlog done within the TTFT
   target, its requests within the slots — once it has outlived `present_after_s` (a burst shorter
   than that is over before a worker started for it could serve);
4. up at once; down only with hysteresis: the size for the load grown by max_utilisation /
   `down_utilisation` (every constraint at once) must be below the pool for a whole hold
   (`down_after_s` or `down_hold_cold_starts` cold starts, whichever is longer), and then to the
   largest band size of that hold; and only when no latency window of the hold had its TTFT
   quantile over `down_ttft_share` of the target while the engines queued prefill (the engine model does
   not see everything — a long prompt ahead of short ones — and a pool at its measured limit is not
   given back a worker it will ask for again a minute later); to zero only after `idle_after_s` idle.
Measured latency corrects the forecast: the TTFT quantile over the tier's target for
`latency_up_after_s` while the engines queue prefill (their backlog per ready worker takes at least
`queueing_share` of the target to clear: a single long prompt's own prefill is no shortage of
workers), or the queue wait over its target for `wait_up_after_s`, with no worker warming and no
more capacity planned, adds one worker (a noisy window does not, nor does a wait that a worker
already starting will absorb).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field, model_validator

from llmbus_services.autoscaler.core.base import POLICIES, Bounds, Decision, PolicyParams
from llmbus_services.autoscaler.core.forecast import DailyPattern, RateForecaster
from llmbus_services.autoscaler.core.signals import PoolSignals
from llmbus_services.autoscaler.core.sizing import (
    EngineModel,
    Headroom,
    TokenLoad,
    workers_for,
    workers_for_present,
)
from llmbus_services.autoscaler.core.timers import Sustained
from llmbus_services.autoscaler.core.workload import BurstTracker, TokenMix

# The sim engine's default profile (llama-3.1-8b-h100 in services/engine_worker/policies/sim_profiles.yaml).
SIM_ENGINE = EngineModel(step_base_us=5752.705, prefill_us_per_token=17.2509, decode_us_per_seq=5.9991)


class PredictiveParams(PolicyParams):
    engine: EngineModel = Field(default=SIM_ENGINE, description="one worker's step-time model (calibrated)")
    ttft_target_ms: float = Field(default=2000.0, gt=0, description="the tier's TTFT target")
    ttft_quantile: Literal["p50", "p90", "p99"] = "p99"
    target_queue_wait_ms: float = Field(default=300.0, gt=0)
    max_utilisation: float = Field(default=0.7, gt=0, le=1, description="of a worker's engine time, on tokens")
    down_utilisation: float = Field(default=0.5, gt=0, le=1, description="hysteresis: down only to this band's size")
    slot_utilisation: float = Field(default=0.9, gt=0, le=1, description="of the batch slots (max_num_seqs)")
    slots_per_worker: int = Field(default=0, ge=0, description="0: the workers' max_num_seqs from their heartbeats")
    default_slots: int = Field(default=256, ge=1)
    default_prompt_tokens: float = Field(default=1000.0, gt=0, description="until arrivals are measured")
    default_output_tokens: float = Field(default=200.0, gt=0, description="until completions are measured")
    token_half_life_s: float = Field(default=300.0, gt=0)
    burst_late_share: float = Field(
        default=0.005, ge=0, lt=1, description="of requests, late because bursts outran the pool: sized for"
    )
    burst_history_s: float = Field(default=3600.0, gt=0, description="the windows the burst ratio is read from")
    default_cold_start_s: float = Field(default=60.0, gt=0, description="until the workers report theirs")
    lead_s: float = Field(default=30.0, ge=0, description="beyond the cold start: evaluation period and slack")
    present_after_s: float = Field(default=30.0, ge=0, description="work in the pool this long is sized for")
    down_after_s: float = Field(default=120.0, ge=0)
    down_hold_cold_starts: float = Field(default=5.0, ge=0, description="hold before a scale-down, in cold starts")
    down_ttft_share: float = Field(
        default=0.5, gt=0, le=1, description="down only if the hold's TTFT quantile stayed within this share of target"
    )
    queueing_share: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="TTFT over target is capacity's fault only while the prefill backlog per ready worker takes"
        " this share of the target to clear (else it is single long prompts, which more workers do not speed up)",
    )
    wait_up_after_s: float = Field(default=30.0, ge=0, description="queue wait above target this long → +1")
    latency_up_after_s: float = Field(default=60.0, ge=0, description="TTFT above target this long → +1")
    min_ttft_samples: int = Field(default=20, ge=1)
    idle_after_s: float = Field(default=600.0, ge=0)
    min_rate_per_s: float = Field(default=0.001, ge=0, description="below this the forecast counts as no traffic")
    level_half_life_s: float = Field(
        default=600.0, gt=0, description="of the arrival rate (the tide is the daily pattern's; bursts are sized apart)"
    )
    trend_half_life_s: float = Field(default=300.0, gt=0)
    pattern_bin_s: float = Field(default=600.0, gt=0)

    @model_validator(mode="after")
    def _bands(self) -> PredictiveParams:
        if self.down_utilisation > self.max_utilisation:
            raise ValueError(f"down_utilisation {self.down_utilisation} > max_utilisation {self.max_utilisation}")
        return self


@POLICIES.register("predictive")
@dataclass
class PredictivePolicy:
    Params = PredictiveParams

    bounds: Bounds = field(default_factory=Bounds)
    params: PredictiveParams = field(default_factory=PredictiveParams)
    name: str = "predictive"
    forecaster: RateForecaster = field(init=False)
    mix: TokenMix = field(init=False)
    bursts: BurstTracker = field(init=False)
    _busy_at_ms: int | None = None
    _present: deque[tuple[int, int]] = field(default_factory=deque)  # (t_ms, workers the work present needs)
    _wait_high: Sustained = field(default_factory=Sustained)
    _latency_high: Sustained = field(default_factory=Sustained)
    _down_sizes: deque[tuple[int, int]] = field(default_factory=deque)  # (t_ms, size at the down band)
    _slow_at_ms: int | None = None  # the last latency window over `down_ttft_share` of the target
    _held_since_ms: int | None = None  # first evaluation of the current hold window

    def __post_init__(self) -> None:
        p = self.params
        self.forecaster = RateForecaster(p.level_half_life_s, p.trend_half_life_s, DailyPattern(bin_s=p.pattern_bin_s))
        self.mix = TokenMix(p.token_half_life_s)
        self.bursts = BurstTracker(p.burst_history_s)

    def observe_history(self, t_s: float, arrivals: int, window_s: float) -> None:
        """Feed past arrivals (e.g. yesterday's, replayed from llm.pool-stats) to the daily pattern."""
        self.forecaster.observe(t_s, arrivals, window_s)

    def _observe(self, signals: PoolSignals) -> None:
        t_s = signals.now_ms / 1000
        self.forecaster.observe(t_s, signals.arrivals, signals.window_s)
        self.mix.observe(
            signals.window_s,
            signals.arrivals,
            signals.arrival_prompt_tokens,
            signals.completed,
            signals.completion_tokens,
        )
        self.bursts.observe(t_s, signals.window_s, signals.arrivals, signals.arrival_prompt_tokens)

    def _load(self, rate_per_s: float, window_s: float) -> TokenLoad:
        p = self.params
        return TokenLoad(
            rate_per_s,
            self.mix.prompt_tokens or p.default_prompt_tokens,
            self.mix.output_tokens or p.default_output_tokens,
            self.bursts.profile(),
            window_s or 5.0,
        )

    def _present_need(self, now: int, need_now: int) -> int:
        """Workers the work present has needed throughout the last `present_after_s` (0 until it has lasted)."""
        self._present.append((now, need_now))
        while len(self._present) > 1 and now - self._present[1][0] >= self.params.present_after_s * 1000:
            self._present.popleft()
        if now - self._present[0][0] < self.params.present_after_s * 1000:
            return 0
        return min(n for _, n in self._present)

    def _hold_down(self, now: int, down_size: int, hold_s: float) -> tuple[int, float]:
        """The largest down-band size over the last `hold_s`, and how long the window covers."""
        self._down_sizes.append((now, down_size))
        while self._down_sizes and now - self._down_sizes[0][0] > hold_s * 1000:
            self._down_sizes.popleft()
        self._held_since_ms = now if self._held_since_ms is None else self._held_since_ms
        return max(n for _, n in self._down_sizes), (now - self._held_since_ms) / 1000

    def decide(self, signals: PoolSignals, current_replicas: int) -> Decision:
        p = self.params
        now, t_s = signals.now_ms, signals.now_ms / 1000
        self._observe(signals)
        slots = p.slots_per_worker or signals.slots_per_worker or p.default_slots
        cold_start_s = signals.cold_start_s or p.default_cold_start_s
        horizon_s = cold_start_s + p.lead_s
        peak = self.forecaster.peak_rate_per_s(t_s, horizon_s)
        rate = peak if peak >= p.min_rate_per_s else 0.0
        load = self._load(rate, signals.window_s)
        ttft_target_s = p.ttft_target_ms / 1000
        headroom = Headroom(p.max_utilisation, p.slot_utilisation, ttft_target_s, p.burst_late_share)
        forecast_need = workers_for(load, p.engine, slots, headroom, self.bounds.max_replicas)
        present_now = workers_for_present(signals.prefill_backlog_tokens, signals.in_flight, p.engine, slots, headroom)
        present = self._present_need(now, present_now)
        need = max(forecast_need, present)
        # The down band: the size for the load grown by max/down utilisation, on every constraint at once
        # (engine time, slots, bursts), so a pool given back a worker is not short of it on the next ripple.
        band_load = load.scaled(p.max_utilisation / p.down_utilisation)
        down_need = max(need, workers_for(band_load, p.engine, slots, headroom, self.bounds.max_replicas))
        # Live workers of the pool that are not this policy's (make up's static ones) already serve
        # part of the need: the pool is sized on top of them.
        others = max(0, signals.workers_ready + signals.workers_warming - current_replicas)
        need, down_need = max(0, need - others), max(0, down_need - others)
        reason = (
            f"forecast {peak:.3f}/s within {horizon_s:.0f}s x ({load.prompt_tokens:.0f} prompt + "
            f"{load.output_tokens:.0f} output tokens) → {need} workers"
        )
        if present > forecast_need:
            reason = (
                f"work present for {p.present_after_s:.0f}s ({signals.prefill_backlog_tokens} prefill tokens, "
                f"{signals.in_flight} in flight) → {need} workers"
            )
        coming = signals.workers_warming > 0
        backlog_s = p.engine.prefill_s(signals.prefill_backlog_tokens) / max(1, signals.workers_ready)
        queueing = backlog_s >= p.queueing_share * ttft_target_s
        evidence = signals.ttft_over(p.ttft_target_ms, p.ttft_quantile, p.min_ttft_samples)
        evidence = evidence and queueing if evidence is not None else None
        if queueing and signals.ttft_over(p.down_ttft_share * p.ttft_target_ms, p.ttft_quantile, p.min_ttft_samples):
            self._slow_at_ms = now
        slow_s = self._latency_high.update(now, False if coming else evidence)
        waiting = signals.queue_wait_ms > p.target_queue_wait_ms
        placed_or_queued = signals.queue_wait_ms_p50 is not None or signals.queued
        wait_s = self._wait_high.update(now, False if coming else (waiting if placed_or_queued else None))
        if need <= current_replicas and (slow_s >= p.latency_up_after_s or wait_s >= p.wait_up_after_s):
            need = down_need = current_replicas + 1
            reason = (
                f"{p.ttft_quantile} TTFT {signals.ttft_ms(p.ttft_quantile) or 0:.0f} ms above target for {slow_s:.0f}s"
                if slow_s >= p.latency_up_after_s
                else f"queue wait {signals.queue_wait_ms:.0f} ms above target for {wait_s:.0f}s"
            ) + " despite the forecast: +1"
            self._latency_high.reset()  # the next +1 needs its own sustained evidence
            self._wait_high.reset()
        if not signals.idle or self._busy_at_ms is None:
            self._busy_at_ms = now
        idle_s = (now - self._busy_at_ms) / 1000
        if idle_s >= p.idle_after_s:  # a long-smoothed level would keep forecasting the traffic that has stopped
            self.forecaster.level_per_s = 0.0
        if need == 0 and not others and (signals.queued or signals.arrivals):
            need = down_need = 1
            reason = "request waiting on a pool at zero: cold start"
        if need == 0 and idle_s < p.idle_after_s:
            need = min(current_replicas, 1)  # keep one until the pool has been idle long enough
            down_need = max(down_need, need)
        hold_s = max(p.down_after_s, p.down_hold_cold_starts * cold_start_s)
        held, held_s = self._hold_down(now, self.bounds.clamp(down_need), hold_s)
        values = signals.values() | {
            "forecast_peak_rate_per_s": round(peak, 4),
            "level_rate_per_s": round(self.forecaster.level_per_s or 0.0, 4),
            "prompt_tokens_mean": round(load.prompt_tokens, 1),
            "output_tokens_mean": round(load.output_tokens, 1),
            "burst_windows_above_mean": float(len(load.bursts.bursts)),
            "forecast_replicas": float(forecast_need),
            "present_replicas": float(present),
            "ttft_high_for_s": slow_s,
            "horizon_s": horizon_s,
            "idle_for_s": idle_s,
            "down_band_replicas": float(held),
        }
        desired = self.bounds.clamp(need)
        if desired > current_replicas:
            self._restart_hold(now, desired)
            return Decision(current_replicas, desired, reason, values)
        if current_replicas > self.bounds.max_replicas:
            return Decision(current_replicas, self.bounds.max_replicas, "above max_replicas", values)
        if desired == 0 and current_replicas > 0:  # the idle timer was the hold
            self._restart_hold(now, 0)
            return Decision(current_replicas, 0, f"idle for {idle_s:.0f}s: to zero", values)
        if held >= current_replicas:
            return Decision(current_replicas, current_replicas, "sized", values)
        if held_s < hold_s:
            return Decision(current_replicas, current_replicas, f"surplus for {held_s:.0f}s, holding", values)
        if self._slow_at_ms is not None and now - self._slow_at_ms < hold_s * 1000:
            return Decision(
                current_replicas,
                current_replicas,
                f"surplus, but {p.ttft_quantile} TTFT was over {p.down_ttft_share:g} of target within the hold",
                values,
            )
        self._restart_hold(now, held)
        return Decision(
            current_replicas,
            held,
            f"{held} workers at {p.down_utilisation:g} utilisation for the last {hold_s:.0f}s "
            f"(forecast peak {peak:.3f}/s within {horizon_s:.0f}s): scale down",
            values,
        )

    def _restart_hold(self, now: int, replicas: int) -> None:
        """A change of size starts a new hold window: the next scale-down waits a whole hold."""
        self._down_sizes.clear()
        self._down_sizes.append((now, replicas))
        self._held_since_ms = now
