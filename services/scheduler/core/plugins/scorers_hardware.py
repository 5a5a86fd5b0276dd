"""Scorer on hardware: of the workers that can serve a request, prefer the least powerful."""

from __future__ import annotations

from dataclasses import dataclass

from llmbus.domain.hardware import engine_capacity
from llmbus_services.scheduler.core.plugins.base import SCORERS, CycleState
from llmbus_services.scheduler.core.types import SchedRequest, WorkerView

COMPARED_PRECISIONS = ("bf16", "fp16", "fp32")  # a GPU's best 16-bit peak, a CPU's fp32


@SCORERS.register("smallest-capable")
@dataclass
class SmallestCapableScorer:
    """1 for the candidate with the least peak compute, 0 for the most (min-max over peak 16-bit TFLOP/s, a CPU
    node's cores summed); a worker of unknown hardware scores 0.5.

    After the capable-hardware filter every candidate meets the request's tier target, so this puts the small
    tier on CPU nodes and small GPUs and keeps the big GPUs for the work only they can serve.
    """

    name: str = "smallest-capable"

    def score(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> dict[str, float]:
        peaks: dict[str, float] = {}
        for w in workers:
            capacity = engine_capacity(w.hardware_class, w.cpu_count) if w.hardware_class else None
            if capacity is not None:
                peaks[w.worker_id] = max(capacity.peak_tflops.get(p, 0.0) for p in COMPARED_PRECISIONS)
        if not peaks:
            return dict.fromkeys((w.worker_id for w in workers), 0.5)
        lo, hi = min(peaks.values()), max(peaks.values())
        return {
            w.worker_id: 0.5 if w.worker_id not in peaks else 1.0 if hi == lo else (hi - peaks[w.worker_id]) / (hi - lo)
            for w in workers
        }
