"""Filter on capability: the worker's hardware, format and engine serve the model at its tier's latency target."""

from __future__ import annotations

from dataclasses import dataclass

from llmbus.contract.messages import ModelSpec
from llmbus_services.scheduler.core.capability import (
    CapabilityTable,
    TierTarget,
    estimate,
    load_table,
    meets,
    weight_bytes_of,
)
from llmbus_services.scheduler.core.plugins.base import FILTERS, CycleState
from llmbus_services.scheduler.core.types import SchedRequest, WorkerView

# Engines whose answer comes from elsewhere (a hosted API) or from a simulator: their node's hardware says
# nothing of their speed, except the sim's, which stands in for the hardware its node profile names.
NOT_JUDGED_ENGINES = frozenset({"openai-http"})


@FILTERS.register("capable-hardware")
@dataclass
class CapableHardwareFilter:
    """Keeps a worker only if the roofline estimate (core/capability.py) for this request on its hardware class
    and model format meets the request's tier targets (TTFT, TPOT).

    Not judged, and kept: a request without a tier in the table, a hosted engine, a worker whose node has no
    known hardware class, a model without formats in the registry. `table`: a shipped table's name or a path.
    """

    table: str = "capability"
    name: str = "capable-hardware"

    def __post_init__(self) -> None:
        self._table: CapabilityTable = load_table(self.table)  # a bad table fails at start, with the pipeline

    def filter(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> list[WorkerView]:
        target = self._table.tiers.get(request.tier or "")
        if target is None:
            return workers
        spec = state.model_specs.get(request.model)
        return [w for w in workers if self._admits(w, spec, request, target)]

    def _admits(self, w: WorkerView, spec: ModelSpec | None, request: SchedRequest, target: TierTarget) -> bool:
        if w.engine in NOT_JUDGED_ENGINES or w.hardware_class is None:
            return True
        weights = weight_bytes_of(spec, w.model_format)
        if weights is None:
            return True
        fmt, weight_bytes = weights
        est = estimate(self._table, w.hardware_class, w.cpu_count, fmt, weight_bytes, request.prompt_tokens)
        return est is None or meets(target, est)
