"""Scorers on affinity: the worker that already holds the prompt's prefix, or the session's last turn."""

from __future__ import annotations

from dataclasses import dataclass

from llmbus_services.scheduler.core.plugins.base import SCORERS, CycleState
from llmbus_services.scheduler.core.types import SchedRequest, WorkerView


@SCORERS.register("prefix-affinity")
@dataclass
class PrefixAffinityScorer:
    """Share of the prompt's leading blocks the worker is believed to hold in its prefix cache."""

    name: str = "prefix-affinity"

    def score(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> dict[str, float]:
        hashes = request.prefix_block_hashes
        if not hashes:
            return dict.fromkeys((w.worker_id for w in workers), 0.0)
        matched = state.prefix_matches(request)
        return {w.worker_id: matched.get(w.worker_id, 0) / len(hashes) for w in workers}


@SCORERS.register("session-affinity")
@dataclass
class SessionAffinityScorer:
    """1 for the worker that served the session's previous turn, else 0."""

    name: str = "session-affinity"

    def score(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> dict[str, float]:
        last = state.sessions.worker_of(request.session_id)
        return {w.worker_id: 1.0 if w.worker_id == last else 0.0 for w in workers}
