"""Plugin interfaces of the placement pipeline (the shape of llm-d's inference scheduler).

A Filter drops workers that must not get the request; a Scorer rates each remaining worker
in [0, 1]; the pipeline sums the scores by weight and a Picker chooses. Plugins are
registered by name (llmbus.contract.plugins) and built from YAML (`services/scheduler/policies/*.yaml`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol

from llmbus.contract.messages import ModelSpec
from llmbus.contract.plugins import Registry
from llmbus.contract.request_key import RequestKey
from llmbus_services.scheduler.core.fleet import FleetView
from llmbus_services.scheduler.core.prefix_index import PrefixIndex, SessionIndex
from llmbus_services.scheduler.core.types import SchedRequest, WorkerView


@dataclass
class CycleState:
    """What plugins may read while placing one request."""

    now_ms: int
    fleet: FleetView
    prefix_index: PrefixIndex
    sessions: SessionIndex
    model_specs: dict[str, ModelSpec] = field(default_factory=dict)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    prefix_block_tokens: int = 16  # tokens per hash in SchedRequest.prefix_block_hashes
    heartbeat_timeout_ms: int | None = None  # a worker heard from longer ago is not placed on
    _matches: dict[RequestKey, tuple[list[str], dict[str, int]]] = field(default_factory=dict)

    def prefix_matches(self, request: SchedRequest) -> dict[str, int]:
        """Worker id → leading prompt blocks it holds; computed once per cycle and request."""
        cached = self._matches.get(request.key)
        if cached is not None and cached[0] is request.prefix_block_hashes:
            return cached[1]
        found = self.prefix_index.matched_blocks(request.prefix_block_hashes, self.now_ms)
        self._matches[request.key] = (request.prefix_block_hashes, found)
        return found

    def uncached_tokens(self, request: SchedRequest, worker_id: str) -> int:
        """Prompt tokens the worker would still have to compute (what its prefix cache lacks)."""
        cached = self.prefix_matches(request).get(worker_id, 0) * self.prefix_block_tokens
        return max(0, request.prompt_tokens - cached)


class Filter(Protocol):
    name: str

    def filter(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> list[WorkerView]: ...


class Scorer(Protocol):
    name: str

    def score(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> dict[str, float]:
        """Worker id → score in [0, 1] (1 = best); a worker left out scores 0."""
        ...


class Picker(Protocol):
    name: str

    def pick(self, state: CycleState, request: SchedRequest, scored: list[tuple[WorkerView, float]]) -> WorkerView: ...


FILTERS: Registry[Filter] = Registry("filter")
SCORERS: Registry[Scorer] = Registry("scorer")
PICKERS: Registry[Picker] = Registry("picker")
