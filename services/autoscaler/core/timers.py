"""How long a condition has held without a break: the "for N minutes" of every scaling trigger."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Sustained:
    """`update(now, True)` starts (or continues) the streak, `update(now, False)` breaks it, and
    `update(now, None)` — a window that says nothing (no request finished, nothing placed) — keeps it:
    a quiet moment inside a burst is not evidence that the pool has caught up."""

    since_ms: int | None = None

    def update(self, now_ms: int, high: bool | None) -> float:
        """Seconds the condition has held now (0 when it does not)."""
        if high is True and self.since_ms is None:
            self.since_ms = now_ms
        elif high is False:
            self.since_ms = None
        return self.held_s(now_ms)

    def held_s(self, now_ms: int) -> float:
        return (now_ms - self.since_ms) / 1000 if self.since_ms is not None else 0.0

    def reset(self) -> None:
        self.since_ms = None
