"""Per-tier latency targets: the policy's targets, and a window of observed TTFT per tier. No I/O.

The router stamps each routed request with its tier's target
(`metadata["llmbus.latency_target_ms"]`, `metadata["llmbus.tier"]`), and feeds the TTFT of every
OK, non-cached, non-shadow result from llm.results into `TierLatencyWatch`. A tier is *missing*
its target when, over the last `window_s`, at least `min_samples` results were seen and their
TTFT quantile `quantile` (p90 by default) is above the target. While a tier misses, the router
may route to the first model of the fallback chain whose tier is not missing
(`prefer_fallback_while_missing`). Note: with several router replicas each sees the results of
its own partitions of llm.results: a sample of the traffic, which is what a quantile needs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from llmbus_services.router.core.config import LatencyPolicy

TARGET_KEY = "llmbus.latency_target_ms"
TIER_KEY = "llmbus.tier"


@dataclass(frozen=True)
class TierVerdict:
    tier: str
    target_ms: float
    observed_ms: float | None  # the quantile over the window; None with too few samples
    samples: int
    missing: bool
    quantile: float

    def line(self) -> str:
        q = round(self.quantile * 100)
        seen = f"p{q} {self.observed_ms:.0f} ms" if self.observed_ms is not None else "too few samples"
        state = "MISSING" if self.missing else "ok"
        return f"tier {self.tier}: TTFT {seen} vs target {self.target_ms:.0f} ms over {self.samples} results: {state}"


class TierLatencyWatch:
    def __init__(self, policy: LatencyPolicy) -> None:
        self.policy = policy
        self._seen: dict[str, deque[tuple[float, float]]] = {}  # tier -> (at_s, ttft_ms)

    def target_ms(self, tier: str) -> float | None:
        return self.policy.targets_ms.get(tier)

    def observe(self, tier: str, ttft_ms: float, at_s: float) -> None:
        if tier not in self.policy.targets_ms:
            return
        window = self._seen.setdefault(tier, deque())
        window.append((at_s, ttft_ms))
        self._expire(window, at_s)

    def _expire(self, window: deque[tuple[float, float]], now_s: float) -> None:
        while window and window[0][0] < now_s - self.policy.window_s:
            window.popleft()

    def verdict(self, tier: str, now_s: float) -> TierVerdict | None:
        target = self.target_ms(tier)
        if target is None:
            return None
        window = self._seen.get(tier, deque())
        self._expire(window, now_s)
        n = len(window)
        if n < self.policy.min_samples:
            return TierVerdict(tier, target, None, n, False, self.policy.quantile)
        ordered = sorted(ttft for _, ttft in window)
        observed = ordered[min(n - 1, int(self.policy.quantile * n))]
        return TierVerdict(tier, target, observed, n, observed > target, self.policy.quantile)

    def verdicts(self, now_s: float) -> list[TierVerdict]:
        return [v for tier in sorted(self.policy.targets_ms) if (v := self.verdict(tier, now_s)) is not None]

    def missing(self, tier: str, now_s: float) -> bool:
        v = self.verdict(tier, now_s)
        return v is not None and v.missing


def avoid_missing_tier(
    model: str, chain: list[str], tier: Callable[[str], str], watch: TierLatencyWatch, now_s: float
) -> tuple[str, list[str], str] | None:
    """(model, rest of chain, reason) to use instead of `model` while its tier misses; None: keep it."""
    if not watch.policy.prefer_fallback_while_missing or not watch.missing(tier(model), now_s):
        return None
    for i, candidate in enumerate(chain):
        if not watch.missing(tier(candidate), now_s):
            return candidate, chain[i + 1 :], f"latency_fallback:{model}->{candidate}:{tier(model)}"
    return None
