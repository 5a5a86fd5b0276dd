"""Scale ahead of the tide: forecast arrivals, size by Little's law, start one cold start early.

Each evaluation:
1. the forecaster takes the window's arrivals (recent level + trend, and the daily pattern
   once a day has been seen) and gives the peak rate expected within one cold start plus
   `lead_s` — the earliest moment a worker started now could serve;
2. the measured service time (placed → finished, smoothed) turns that rate into work in
   service (Little's law), and Erlang C over the pool's slots (workers x max_num_seqs) into
   the fewest workers that keep queue wait under target, with utilisation capped;
3. up at once; down only after the forecast has said "not needed within a cold start" for
   `down_after_s` (so a dip between two peaks does not cost two cold starts); to zero only
   when the pool has also been idle for `idle_after_s`.
A measured queue wait above target with no more capacity planned adds a worker: the
forecast was wrong, the queue is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from services.autoscaler.policy.base import Bounds, Decision, register
from services.autoscaler.policy.forecast import DailyPattern, RateForecaster, _alpha
from services.autoscaler.policy.signals import PoolSignals
from services.autoscaler.policy.sizing import replicas_for


@register("predictive")
@dataclass
class PredictivePolicy:
    bounds: Bounds = field(default_factory=Bounds)
    target_queue_wait_ms: float = 300.0
    max_utilisation: float = 0.8
    slots_per_worker: int = 0  # 0: the workers' max_num_seqs from their heartbeats
    default_slots: int = 8
    default_service_s: float = 5.0  # until a service time is measured
    service_half_life_s: float = 300.0
    default_cold_start_s: float = 60.0  # until the workers report theirs
    lead_s: float = 30.0  # beyond the cold start: evaluation period and placement slack
    down_after_s: float = 120.0
    idle_after_s: float = 600.0
    min_rate_per_s: float = 0.001  # below this the forecast counts as no traffic
    level_half_life_s: float = 60.0
    trend_half_life_s: float = 300.0
    pattern_bin_s: float = 600.0
    name: str = "predictive"
    forecaster: RateForecaster = field(init=False)
    service_s: float | None = None
    _surplus_since_ms: int | None = None
    _busy_at_ms: int | None = None

    def __post_init__(self) -> None:
        self.forecaster = RateForecaster(
            self.level_half_life_s, self.trend_half_life_s, DailyPattern(bin_s=self.pattern_bin_s)
        )

    def observe_history(self, t_s: float, arrivals: int, window_s: float) -> None:
        """Feed past arrivals (e.g. yesterday's, replayed from llm.pool-stats) to the daily pattern."""
        self.forecaster.observe(t_s, arrivals, window_s)

    def _update_service(self, signals: PoolSignals) -> float:
        if signals.service_ms_mean is not None and signals.completed > 0:
            measured = signals.service_ms_mean / 1000
            if self.service_s is None:
                self.service_s = measured
            else:
                a = _alpha(signals.window_s, self.service_half_life_s)
                self.service_s = a * measured + (1 - a) * self.service_s
        return self.service_s if self.service_s is not None else self.default_service_s

    def decide(self, signals: PoolSignals, current_replicas: int) -> Decision:
        now, t_s = signals.now_ms, signals.now_ms / 1000
        self.forecaster.observe(t_s, signals.arrivals, signals.window_s)
        service_s = self._update_service(signals)
        slots = self.slots_per_worker or signals.slots_per_worker or self.default_slots
        cold_start_s = signals.cold_start_s or self.default_cold_start_s
        horizon_s = cold_start_s + self.lead_s
        peak = self.forecaster.peak_rate_per_s(t_s, horizon_s)
        rate = peak if peak >= self.min_rate_per_s else 0.0
        need = replicas_for(
            rate, service_s, slots, self.target_queue_wait_ms / 1000, self.max_utilisation, self.bounds.max_replicas
        )
        # What is running now must keep a place (Little's law on the present, not the forecast).
        need = max(need, math.ceil(signals.in_flight / (slots * self.max_utilisation)))
        reason = f"forecast peak {peak:.3f}/s within {horizon_s:.0f}s x {service_s:.2f}s service → {need} workers"
        if signals.queue_wait_ms > self.target_queue_wait_ms and need <= current_replicas:
            need = current_replicas + 1
            reason = f"queue wait {signals.queue_wait_ms:.0f} ms above target despite the forecast: +1"
        if not signals.idle or self._busy_at_ms is None:
            self._busy_at_ms = now
        idle_s = (now - self._busy_at_ms) / 1000
        if need == 0 and (signals.queued or signals.arrivals):
            need = 1
            reason = "request waiting on a pool at zero: cold start"
        if need == 0 and idle_s < self.idle_after_s:
            need = min(current_replicas, 1)  # keep one until the pool has been idle long enough
        values = signals.values() | {
            "forecast_peak_rate_per_s": round(peak, 4),
            "level_rate_per_s": round(self.forecaster.level_per_s or 0.0, 4),
            "service_s": round(service_s, 3),
            "horizon_s": horizon_s,
            "idle_for_s": idle_s,
        }
        desired = self.bounds.clamp(need)
        if desired >= current_replicas:
            self._surplus_since_ms = None
            return Decision(current_replicas, desired, reason if desired > current_replicas else "sized", values)
        # Fewer would do for the whole horizon: wait out `down_after_s` before giving capacity back.
        self._surplus_since_ms = now if self._surplus_since_ms is None else self._surplus_since_ms
        surplus_s = (now - self._surplus_since_ms) / 1000
        if surplus_s < self.down_after_s and current_replicas <= self.bounds.max_replicas:
            return Decision(current_replicas, current_replicas, f"surplus for {surplus_s:.0f}s, holding", values)
        self._surplus_since_ms = None
        return Decision(current_replicas, desired, reason + f"; not needed within {horizon_s:.0f}s", values)
