"""A placement pipeline built from YAML: filters → weighted scorers → picker.

    name: default
    filters:   [{type: serves-model}, {type: gpu-healthy, params: {max_ecc_uncorrected: 0}}, ...]
    scorers:   [{type: queue-depth, weight: 1}, {type: prefix-affinity, weight: 2}, ...]
    picker:    {type: max-score}

Shipped pipelines live in services/scheduler/policies/<name>.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmbus.contract.config_file import load_yaml, shipped_or_path
from llmbus_services.scheduler.core.config import PipelineConfig
from llmbus_services.scheduler.core.plugins import FILTERS, PICKERS, SCORERS, CycleState, Filter, Picker, Scorer
from llmbus_services.scheduler.core.types import SchedRequest, WorkerView

PIPELINES_DIR = Path(__file__).resolve().parent.parent / "policies"


@dataclass
class PickResult:
    worker: WorkerView | None
    candidates: int = 0  # workers left after the filters
    rejected_by: str | None = None  # the filter that removed the last candidate
    scores: dict[str, float] = field(default_factory=dict)


class Pipeline:
    def __init__(self, name: str, filters: list[Filter], scorers: list[tuple[Scorer, float]], picker: Picker) -> None:
        self.name = name
        self.filters = filters
        self.scorers = scorers
        self.picker = picker

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> Pipeline:
        """Built from a validated PipelineConfig: a bad file fails here, at start-up, with the reason."""
        return cls.from_config(PipelineConfig.model_validate(cfg))

    @classmethod
    def from_config(cls, spec: PipelineConfig) -> Pipeline:
        filters = [FILTERS.build(f.type, f.params) for f in spec.filters]
        scorers = [(SCORERS.build(s.type, s.params), s.weight) for s in spec.scorers]
        return cls(spec.name, filters, scorers, PICKERS.build(spec.picker.type, spec.picker.params))

    @classmethod
    def load(cls, name_or_path: str) -> Pipeline:
        """A shipped pipeline by name (`default`, `least-loaded`, `round-robin`) or a YAML path."""
        return cls.from_config(load_yaml(shipped_or_path(name_or_path, PIPELINES_DIR), PipelineConfig))

    def pick(self, state: CycleState, request: SchedRequest) -> PickResult:
        workers = list(state.fleet.workers.values())
        if request.kv_blocks_free_over is not None:
            # An OOM's retry, whatever the pipeline: only where more KV is free than where it failed.
            workers = [w for w in workers if w.kv_blocks_free_est > request.kv_blocks_free_over]
            if not workers:
                return PickResult(None, 0, rejected_by="oom-more-free-kv")
        for f in self.filters:
            kept = f.filter(state, request, workers)
            if not kept:
                return PickResult(None, 0, rejected_by=f.name)
            workers = kept
        total = dict.fromkeys((w.worker_id for w in workers), 0.0)
        for scorer, weight in self.scorers:
            if weight == 0:
                continue
            for wid, s in scorer.score(state, request, workers).items():
                total[wid] += weight * min(1.0, max(0.0, s))
        chosen = self.picker.pick(state, request, [(w, total[w.worker_id]) for w in workers])
        return PickResult(chosen, len(workers), scores=total)
