"""Filters on what a worker is: serves the model and is ready; hardware runs the model's format;
its engine honours what the request asks for."""

from __future__ import annotations

from dataclasses import dataclass

from llmbus.contract.engine_features import missing_features
from llmbus.contract.messages import WorkerState
from llmbus_services.scheduler.core.plugins.base import FILTERS, CycleState
from llmbus_services.scheduler.core.types import SchedRequest, WorkerView


@FILTERS.register("serves-model")
@dataclass
class ServesModelFilter:
    """Serves the request's model (and its version, when its release names one), is READY (not starting,
    draining, stopped, or DEGRADED: its upstream failing, circuit open), heard from lately, and not cooling
    down after its upstream said 429/503.

    Workers that already failed this request are left out while any other can serve it;
    with `strict_exclude` they are left out even when they are the only ones.
    """

    strict_exclude: bool = False
    name: str = "serves-model"

    def filter(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> list[WorkerView]:
        timeout = state.heartbeat_timeout_ms
        ready = [
            w
            for w in workers
            if w.serves(request.model, request.model_version)
            and w.state == WorkerState.READY
            and (timeout is None or state.fleet.heard(w, state.now_ms, timeout))
            and state.now_ms >= w.cooldown_until_ms
        ]
        others = [w for w in ready if w.worker_id not in request.excluded_workers]
        return others if others or self.strict_exclude else ready


def _cc_tuple(cc: str) -> tuple[int, ...]:
    return tuple(int(p) for p in cc.split(".") if p.isdigit())


@FILTERS.register("format-supported")
@dataclass
class FormatSupportedFilter:
    """The worker's hardware supports the model format it loaded.

    Two checks: the worker lists the format among `formats_supported` (when it lists any),
    and the node's compute capability reaches the format's minimum from the ModelSpec.
    """

    name: str = "format-supported"

    def filter(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> list[WorkerView]:
        spec = state.model_specs.get(request.model)
        kept = []
        for w in workers:
            fmt = w.model_format
            if fmt and w.formats_supported and fmt not in w.formats_supported:
                continue
            if fmt and spec is not None and w.compute_capability:
                need = next((f.min_compute_capability for f in spec.formats if f.name == fmt), None)
                if need and _cc_tuple(w.compute_capability) < _cc_tuple(need):
                    continue
            kept.append(w)
        return kept


@FILTERS.register("engine-supports")
@dataclass
class EngineSupportsFilter:
    """Workers whose engine honours the request's response_format, tools or suffix, when any does.

    When none does, all stay: the worker that gets it refuses it with a clear final error
    (invalid_request), instead of the request waiting for a worker that will never come.
    """

    name: str = "engine-supports"

    def filter(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> list[WorkerView]:
        if not request.engine_features:
            return workers
        able = [w for w in workers if not missing_features(w.engine, request.engine_features, w.engine_features)]
        return able or workers
