"""Pickers: the highest weighted score (random among ties), or plain round-robin."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmbus_services.scheduler.core.plugins.base import PICKERS, CycleState
from llmbus_services.scheduler.core.types import SchedRequest, WorkerView


@PICKERS.register("max-score")
@dataclass
class MaxScorePicker:
    """Highest score wins; ties (within `tie_epsilon`) are broken by the cycle's seeded rng."""

    tie_epsilon: float = 1e-9
    name: str = "max-score"

    def pick(self, state: CycleState, request: SchedRequest, scored: list[tuple[WorkerView, float]]) -> WorkerView:
        best = max(score for _, score in scored)
        ties = [w for w, score in scored if best - score <= self.tie_epsilon]
        return ties[0] if len(ties) == 1 else state.rng.choice(ties)


@PICKERS.register("round-robin")
@dataclass
class RoundRobinPicker:
    """Ignores scores: the next worker (by id order) after the one picked last time for the model."""

    name: str = "round-robin"
    _next: dict[str, int] = field(default_factory=dict)

    def pick(self, state: CycleState, request: SchedRequest, scored: list[tuple[WorkerView, float]]) -> WorkerView:
        ordered = sorted((w for w, _ in scored), key=lambda w: w.worker_id)
        i = self._next.get(request.model, 0) % len(ordered)
        self._next[request.model] = i + 1
        return ordered[i]
