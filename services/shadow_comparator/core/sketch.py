"""A mergeable latency histogram: log-spaced bins, counts that add.

Bin i holds values in [GROWTH**i, GROWTH**(i+1)) ms, so a reported percentile is within
GROWTH - 1 (5 %) of the true one, whatever the range. Two histograms merge by adding their
counts bin by bin, which is what lets Redis hold them as HINCRBY fields (one per bin)
written by any number of comparator instances, and lets steps or windows be summed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

GROWTH = 1.05
_LOG_GROWTH = math.log(GROWTH)
MIN_MS = 0.1  # everything below lands in the first bin


def bin_of(value_ms: float) -> int:
    return max(0, math.floor(math.log(max(value_ms, MIN_MS) / MIN_MS) / _LOG_GROWTH))


def bin_value_ms(index: int) -> float:
    """The bin's geometric midpoint: what a percentile falling in it reports."""
    return MIN_MS * GROWTH ** (index + 0.5)


class LatencyHistogram:
    def __init__(self, counts: Mapping[int, int] | None = None) -> None:
        self.counts: dict[int, int] = dict(counts or {})

    def add(self, value_ms: float, count: int = 1) -> None:
        i = bin_of(value_ms)
        self.counts[i] = self.counts.get(i, 0) + count

    def merge(self, other: LatencyHistogram) -> LatencyHistogram:
        merged = dict(self.counts)
        for i, c in other.counts.items():
            merged[i] = merged.get(i, 0) + c
        return LatencyHistogram(merged)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def percentile(self, q: float) -> float | None:
        """q in [0, 100]; None when empty."""
        total = self.total
        if total == 0:
            return None
        rank = max(1, math.ceil(q / 100.0 * total))
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                return bin_value_ms(i)
        return bin_value_ms(max(self.counts))

    @classmethod
    def of(cls, values_ms: Iterable[float]) -> LatencyHistogram:
        hist = cls()
        for v in values_ms:
            hist.add(v)
        return hist
