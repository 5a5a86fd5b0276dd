"""Scorer on LoRA affinity: the worker that has the request's adapter loaded, unless it is saturated."""

from __future__ import annotations

from dataclasses import dataclass

from llmbus_services.scheduler.core.plugins.base import SCORERS, CycleState
from llmbus_services.scheduler.core.types import SchedRequest, WorkerView

LOADED, FREE_SLOT, EVICTS = 1.0, 0.5, 0.0


@SCORERS.register("adapter-affinity")
@dataclass
class AdapterAffinityScorer:
    """1 where the adapter is loaded (no load time, no eviction), 0.5 where a slot is free (a load, nothing
    evicted), 0 where loading it evicts another adapter (the worker's least recently used).

    Loaded but saturated (its load at `saturated_share` of its batch or more) scores as a load elsewhere
    would: the request is better off loading the adapter on an idle worker than queueing behind a full
    batch. A request without an adapter scores every worker alike.
    """

    saturated_share: float = 1.0
    name: str = "adapter-affinity"

    def score(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> dict[str, float]:
        adapter = request.adapter
        if adapter is None:
            return dict.fromkeys((w.worker_id for w in workers), 0.0)
        scores = {}
        for w in workers:
            loaded = w.adapters_loaded_est()
            saturated = w.max_num_seqs > 0 and w.load >= self.saturated_share * w.max_num_seqs
            if adapter.name in loaded and not saturated:
                scores[w.worker_id] = LOADED
            elif len(loaded) < w.max_loras or adapter.name in loaded:
                scores[w.worker_id] = FREE_SLOT
            else:
                scores[w.worker_id] = EVICTS
        return scores
