"""Scale ahead of the tide: forecast arrivals, size by Little's law, start one cold start early.

Each evaluation:
1. the forecaster takes the window's arrivals (recent level + trend, and the daily pattern
   once a day has been seen) and gives the peak rate expected within one cold start plus
   `lead_s` — the earliest moment a worker started now could serve;
2. the measured service time (placed → finished, smoothed) turns that rate into work in
   service (Little's law), and Erlang C over the pool's slots (workers x max_num_seqs) into
   the fewest workers that keep queue wait under target, with utilisation capped;
3. up at once, to the size at `max_utilisation`; down only with hysteresis: the size at the
   lower `down_utilisation` band must be below the pool, and it must have stayed below for
   the whole hold (the pool goes to the largest down-band size of the hold window). The hold
   is `down_after_s` or `down_hold_cold_starts` cold starts, whichever is longer: an idle
   worker kept costs GPU time, a worker given back and needed again costs a cold start of GPU
   time and the first tokens that wait for it (so a dip between two peaks costs no flap). To
   zero only when the pool has also been idle for `idle_after_s`.
The work present (in flight, and a backlog that outlived a window) keeps the slots it needs.
A measured queue wait above target for `wait_up_after_s` with no more capacity planned and
none warming adds a worker: the forecast was wrong, the queue is not. One noisy window does
not, nor does a wait that a worker already starting will absorb.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from llmbus_services.autoscaler.core.base import Bounds, Decision, register
from llmbus_services.autoscaler.core.forecast import DailyPattern, RateForecaster, _alpha
from llmbus_services.autoscaler.core.signals import PoolSignals
from llmbus_services.autoscaler.core.sizing import replicas_for


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
    down_utilisation: float = 0.55  # hysteresis: scale down only to the size at this lower band
    down_hold_cold_starts: float = 5.0  # hold before a scale-down, in cold starts (when longer than down_after_s)
    in_flight_utilisation: float = 1.0  # the work in flight now needs its slots at this utilisation
    wait_up_after_s: float = 30.0  # queue wait above target this long (and nothing warming) → +1
    idle_after_s: float = 600.0
    min_rate_per_s: float = 0.001  # below this the forecast counts as no traffic
    level_half_life_s: float = 60.0
    trend_half_life_s: float = 300.0
    pattern_bin_s: float = 600.0
    name: str = "predictive"
    forecaster: RateForecaster = field(init=False)
    service_s: float | None = None
    _busy_at_ms: int | None = None
    _queued_before: int = 0
    _wait_high_since_ms: int | None = None
    _down_sizes: deque[tuple[int, int]] = field(default_factory=deque)  # (t_ms, size at the down band)
    _held_since_ms: int | None = None  # first evaluation of the current hold window

    def __post_init__(self) -> None:
        if not 0 < self.in_flight_utilisation <= 1:
            raise ValueError(f"need 0 < in_flight_utilisation ({self.in_flight_utilisation}) <= 1")
        if not 0 < self.down_utilisation <= self.max_utilisation <= 1:
            raise ValueError(
                f"need 0 < down_utilisation ({self.down_utilisation}) <= max_utilisation ({self.max_utilisation}) <= 1"
            )
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

    def _size(self, rate: float, service_s: float, slots: int, utilisation: float) -> int:
        return replicas_for(
            rate, service_s, slots, self.target_queue_wait_ms / 1000, utilisation, self.bounds.max_replicas
        )

    def _present(self, signals: PoolSignals, slots: int) -> tuple[int, int]:
        """Workers the work present now needs (Little's law on the present, not the forecast): what runs
        keeps its slots (at `in_flight_utilisation`), and a backlog that outlived one window wants slots
        too. One window's burst, of work in flight or waiting, is noise the hold must not turn into a
        held worker (the old rule sized work in flight at the cap: most of its flapping)."""
        backlog = min(signals.queued, self._queued_before)
        self._queued_before = signals.queued
        return math.ceil((signals.in_flight + backlog) / (slots * self.in_flight_utilisation)), backlog

    def _wait_sustained(self, signals: PoolSignals) -> bool:
        """Queue wait above target for `wait_up_after_s` with no worker warming (a window with nothing
        placed and nothing queued says nothing and keeps the timer)."""
        now = signals.now_ms
        if signals.workers_warming:  # capacity on its way: the wait it will absorb is no evidence yet
            self._wait_high_since_ms = None
        elif signals.queue_wait_ms > self.target_queue_wait_ms:
            self._wait_high_since_ms = now if self._wait_high_since_ms is None else self._wait_high_since_ms
        elif signals.queue_wait_ms_p50 is not None or signals.queued:
            self._wait_high_since_ms = None
        if self._wait_high_since_ms is None:
            return False
        return (now - self._wait_high_since_ms) / 1000 >= self.wait_up_after_s

    def _hold_down(self, now: int, down_size: int, hold_s: float) -> tuple[int, float]:
        """The largest down-band size over the last `hold_s`, and how long the window covers."""
        self._down_sizes.append((now, down_size))
        while self._down_sizes and now - self._down_sizes[0][0] > hold_s * 1000:
            self._down_sizes.popleft()
        self._held_since_ms = now if self._held_since_ms is None else self._held_since_ms
        return max(n for _, n in self._down_sizes), (now - self._held_since_ms) / 1000

    def decide(self, signals: PoolSignals, current_replicas: int) -> Decision:
        now, t_s = signals.now_ms, signals.now_ms / 1000
        self.forecaster.observe(t_s, signals.arrivals, signals.window_s)
        service_s = self._update_service(signals)
        slots = self.slots_per_worker or signals.slots_per_worker or self.default_slots
        cold_start_s = signals.cold_start_s or self.default_cold_start_s
        horizon_s = cold_start_s + self.lead_s
        peak = self.forecaster.peak_rate_per_s(t_s, horizon_s)
        rate = peak if peak >= self.min_rate_per_s else 0.0
        forecast_need = self._size(rate, service_s, slots, self.max_utilisation)
        present, backlog = self._present(signals, slots)
        need = max(forecast_need, present)
        down_need = max(need, self._size(rate, service_s, slots, self.down_utilisation))
        # Live workers of the pool that are not this policy's (make up's static ones) already serve
        # part of the need: the pool is sized on top of them.
        others = max(0, signals.workers_ready + signals.workers_warming - current_replicas)
        need, down_need = max(0, need - others), max(0, down_need - others)
        reason = f"forecast peak {peak:.3f}/s within {horizon_s:.0f}s x {service_s:.2f}s service → {need} workers"
        if present > forecast_need:
            reason = f"{signals.in_flight} in flight + {backlog} waiting for two windows → {need} workers"
        if self._wait_sustained(signals) and need <= current_replicas:
            need = down_need = current_replicas + 1
            reason = (
                f"queue wait {signals.queue_wait_ms:.0f} ms above target for {self.wait_up_after_s:.0f}s "
                "despite the forecast: +1"
            )
            self._wait_high_since_ms = None  # the next +1 needs its own sustained wait
        if not signals.idle or self._busy_at_ms is None:
            self._busy_at_ms = now
        idle_s = (now - self._busy_at_ms) / 1000
        if need == 0 and not others and (signals.queued or signals.arrivals):
            need = down_need = 1
            reason = "request waiting on a pool at zero: cold start"
        if need == 0 and idle_s < self.idle_after_s:
            need = min(current_replicas, 1)  # keep one until the pool has been idle long enough
            down_need = max(down_need, need)
        hold_s = max(self.down_after_s, self.down_hold_cold_starts * cold_start_s)
        held, held_s = self._hold_down(now, self.bounds.clamp(down_need), hold_s)
        values = signals.values() | {
            "forecast_peak_rate_per_s": round(peak, 4),
            "level_rate_per_s": round(self.forecaster.level_per_s or 0.0, 4),
            "service_s": round(service_s, 3),
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
        self._restart_hold(now, held)
        return Decision(
            current_replicas,
            held,
            f"{held} workers at {self.down_utilisation:g} utilisation for the last {hold_s:.0f}s "
            f"(forecast peak {peak:.3f}/s within {horizon_s:.0f}s): scale down",
            values,
        )

    def _restart_hold(self, now: int, replicas: int) -> None:
        """A change of size starts a new hold window: the next scale-down waits a whole hold."""
        self._down_sizes.clear()
        self._down_sizes.append((now, replicas))
        self._held_since_ms = now
