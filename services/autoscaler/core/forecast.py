"""Arrival-rate forecast: a recent level and its trend plus the pool's daily pattern.

`observe` takes what the scheduler counted in each window; `peak_rate_per_s(now, horizon)` is
the highest rate expected between now and now + horizon, the capacity the pool needs within
that time. With at least one earlier day seen, the daily pattern's shape (time-of-day bins)
is scaled to today's level; before that, the level and its trend are all there is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DAY_S = 86_400.0


def smoothing_alpha(window_s: float, half_life_s: float) -> float:
    return 1.0 - math.exp(-math.log(2) * window_s / max(half_life_s, 1e-9))


@dataclass
class DailyPattern:
    """Mean arrival rate per time-of-day bin, blended over days (the newest day weighs `day_weight`)."""

    bin_s: float = 600.0
    day_weight: float = 0.5
    rates_per_s: dict[int, float] = field(default_factory=dict)  # bin → rate, days before today
    _today: dict[int, list[float]] = field(default_factory=dict)  # bin → [arrivals, seconds]
    _day: int | None = None

    def observe(self, t_s: float, arrivals: int, window_s: float) -> None:
        day = int(t_s // DAY_S)
        if self._day is not None and day != self._day:
            self._close_day()
        self._day = day
        acc = self._today.setdefault(self._bin(t_s), [0.0, 0.0])
        acc[0] += arrivals
        acc[1] += window_s

    def _close_day(self) -> None:
        for b, (arrivals, seconds) in self._today.items():
            if seconds <= 0:
                continue
            rate = arrivals / seconds
            old = self.rates_per_s.get(b)
            self.rates_per_s[b] = rate if old is None else self.day_weight * rate + (1 - self.day_weight) * old
        self._today = {}

    def _bin(self, t_s: float) -> int:
        return int((t_s % DAY_S) // self.bin_s)

    @property
    def known(self) -> bool:
        return len(self.rates_per_s) >= int(DAY_S // self.bin_s) // 2

    def rate_at(self, t_s: float) -> float | None:
        """The bin's rate; None where no earlier day covered the time."""
        return self.rates_per_s.get(self._bin(t_s))


@dataclass
class RateForecaster:
    level_half_life_s: float = 60.0
    trend_half_life_s: float = 300.0
    pattern: DailyPattern = field(default_factory=DailyPattern)
    level_per_s: float | None = None
    trend_per_s2: float = 0.0
    max_pattern_scale: float = 3.0  # how far today's level may stretch the pattern's shape
    # The pattern's rate smoothed exactly as the level is: their ratio is today's scale without the
    # level's lag (a long half-life lags a rising tide; the pattern's own smoothing lags it as much).
    pattern_level_per_s: float | None = None

    def observe(self, t_s: float, arrivals: int, window_s: float) -> None:
        if window_s <= 0:
            return
        rate = arrivals / window_s
        usual = self.pattern.rate_at(t_s) if self.pattern.known else None  # days before today's
        self.pattern.observe(t_s, arrivals, window_s)
        a = smoothing_alpha(window_s, self.level_half_life_s)
        if usual is not None:
            old = self.pattern_level_per_s
            self.pattern_level_per_s = usual if old is None else a * usual + (1 - a) * old
        if self.level_per_s is None:
            self.level_per_s = rate
            return
        prev = self.level_per_s
        # A plain smoothed level, the trend kept beside it for extrapolation only: fed back into the level
        # (Holt's way), bursty arrivals swing the trend and drag the level far below the mean between bursts.
        self.level_per_s = a * rate + (1 - a) * prev
        b = smoothing_alpha(window_s, self.trend_half_life_s)
        self.trend_per_s2 = b * (self.level_per_s - prev) / window_s + (1 - b) * self.trend_per_s2

    def rate_at(self, t_s: float, ahead_s: float) -> float:
        level = self.level_per_s or 0.0
        by_trend = max(0.0, level + self.trend_per_s2 * ahead_s)
        now_pattern = self.pattern.rate_at(t_s) if self.pattern.known else None
        then_pattern = self.pattern.rate_at(t_s + ahead_s) if self.pattern.known else None
        if now_pattern is None or then_pattern is None:
            return by_trend
        # Today's traffic relative to the usual at this hour, carried forward along the pattern.
        usual = self.pattern_level_per_s if self.pattern_level_per_s is not None else now_pattern
        scale = level / usual if usual > 0 else 1.0
        scale = min(self.max_pattern_scale, scale)  # no lower clip: a pool gone quiet forecasts quiet
        return then_pattern * scale

    def peak_rate_per_s(self, t_s: float, horizon_s: float, step_s: float = 30.0) -> float:
        """Highest forecast rate over [t, t + horizon]."""
        steps = max(1, math.ceil(horizon_s / step_s))
        return max(self.rate_at(t_s, horizon_s * i / steps) for i in range(steps + 1))
