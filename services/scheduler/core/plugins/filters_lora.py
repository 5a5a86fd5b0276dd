"""Filter on LoRA: a request for an adapter goes only to a worker that loads adapters of that rank."""

from __future__ import annotations

from dataclasses import dataclass

from llmbus_services.scheduler.core.plugins.base import FILTERS, CycleState
from llmbus_services.scheduler.core.types import SchedRequest, WorkerView


@FILTERS.register("serves-adapter")
@dataclass
class ServesAdapterFilter:
    """A request naming a LoRA adapter: workers of its base model with adapter slots (max_loras > 0) and a
    max_lora_rank at least the adapter's rank. A request without one passes every worker."""

    name: str = "serves-adapter"

    def filter(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> list[WorkerView]:
        adapter = request.adapter
        if adapter is None:
            return workers
        return [w for w in workers if w.max_loras > 0 and adapter.rank <= w.max_lora_rank]
