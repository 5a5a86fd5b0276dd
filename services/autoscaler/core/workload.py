"""What a pool's requests are made of: their mean prompt and output tokens, and how bursty the prompts come.

Both are learnt from the pool statistics as they arrive (no tuning on a trace): the token means
are smoothed over `half_life_s`; burstiness is how far each window's prompt tokens exceed the
recent mean, as a ratio, read as a quantile weighted by the window's arrivals — the load a
request typically meets, not the load of a typical window.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from llmbus_services.autoscaler.core.forecast import smoothing_alpha


@dataclass
class TokenMix:
    half_life_s: float = 300.0
    prompt_tokens: float | None = None  # per arrival
    output_tokens: float | None = None  # per completion

    def observe(self, window_s: float, arrivals: int, prompt_tokens: int, completed: int, output_tokens: int) -> None:
        a = smoothing_alpha(window_s, self.half_life_s)
        if arrivals and prompt_tokens:
            mean = prompt_tokens / arrivals
            self.prompt_tokens = mean if self.prompt_tokens is None else a * mean + (1 - a) * self.prompt_tokens
        if completed and output_tokens:
            mean = output_tokens / completed
            self.output_tokens = mean if self.output_tokens is None else a * mean + (1 - a) * self.output_tokens


@dataclass
class BurstTracker:
    """How much a window's prompt tokens exceed the mean around it, as a ratio.

    Each window's prompt tokens are divided by the mean tokens per window of the `mean_window_s`
    centred on it, so a window is rated half that span after it closed. Centred, because a mean
    that only looks back lags a rising tide and reads the tide as bursts; long, because clustered
    arrivals spend most windows far below their mean, and a short level would decay between bursts
    and read each one as a huge one. The ratios of the last `history_s` are kept with the window's
    arrivals as weights (`profile()`): a burst window holds many requests. Bursts scale with the
    rate (a tide lifts them with it), so ratios learnt at one hour's rate size another's. Windows
    whose mean holds fewer than `min_expected` requests are left out: at a trickle one request
    more is a large ratio of nothing.
    """

    history_s: float = 3600.0
    mean_window_s: float = 1800.0
    min_expected: float = 1.0
    _recent: deque[tuple[float, float, int]] = field(default_factory=deque)  # (t_s, tokens, arrivals)
    _recent_tokens: float = 0.0
    _recent_arrivals: int = 0
    _unrated: deque[tuple[float, float, int]] = field(default_factory=deque)  # windows not yet half a span old
    _ratios: deque[tuple[float, float, int]] = field(default_factory=deque)  # (t_s, ratio, arrivals)

    def observe(self, t_s: float, window_s: float, arrivals: int, prompt_tokens: int) -> None:
        if window_s <= 0:
            return
        window = (t_s, float(prompt_tokens), arrivals)
        self._recent.append(window)
        self._unrated.append(window)
        self._recent_tokens += prompt_tokens
        self._recent_arrivals += arrivals
        while self._recent[0][0] <= t_s - self.mean_window_s:
            _, tokens, n = self._recent.popleft()
            self._recent_tokens -= tokens
            self._recent_arrivals -= n
        windows = len(self._recent)
        mean_tokens, mean_arrivals = self._recent_tokens / windows, self._recent_arrivals / windows
        while self._unrated and self._unrated[0][0] <= t_s - self.mean_window_s / 2:
            at_s, tokens, n = self._unrated.popleft()
            if mean_arrivals >= self.min_expected and mean_tokens > 0:
                self._ratios.append((at_s, tokens / mean_tokens, n))
        while self._ratios and self._ratios[0][0] < t_s - self.history_s:
            self._ratios.popleft()

    def profile(self, bin_factor: float = 1.05) -> BurstProfile:
        """The windows above the mean, their ratios binned `bin_factor` apart, with the arrivals they held,
        and every window's arrivals: what a sizing checks burst by burst, in a few dozen steps."""
        bins: dict[int, list[float]] = {}
        total = 0
        for _, ratio, n in self._ratios:
            total += n
            if ratio > 1 and n:
                key = round(math.log(ratio) / math.log(bin_factor))
                acc = bins.setdefault(key, [0.0, 0.0])
                acc[0] += ratio * n
                acc[1] += n
        return BurstProfile(tuple((r / n, int(n)) for r, n in sorted(bins.values())), total)


@dataclass(frozen=True)
class BurstProfile:
    """Windows whose prompt tokens exceeded the mean: (ratio to the mean, arrivals), and all windows' arrivals."""

    bursts: tuple[tuple[float, int], ...] = ()
    arrivals: int = 0

    def late_share(self, capacity_ratio: float) -> float:
        """The share of requests a pool misses when it can prefill `capacity_ratio` mean windows' prompts in
        the time a window's requests have (the window plus the TTFT target): in a window of ratio r > c the
        part of the prompts past c waits longer (arrivals spread evenly over the window's work)."""
        if not self.arrivals:
            return 0.0
        late = sum(n * (1 - capacity_ratio / ratio) for ratio, n in self.bursts if ratio > capacity_ratio)
        return late / self.arrivals
