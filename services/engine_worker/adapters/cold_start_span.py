"""The worker's cold start as one span: from the process's start to ready, with each phase's seconds on it.

The phases are the heartbeat's (`WorkerStatus.cold_start_phases_s`), one attribute each
(`llmbus.cold_start.phase.<name>_s`), so a trace backend shows where a start went beside the requests'
spans. The span is a trace of its own (no request caused it) and is sampled like any root span.
"""

from __future__ import annotations

from opentelemetry import trace

from llmbus.contract import semconv as sc
from llmbus_services.engine_worker.flows import RunSite

SPAN_NAME = "engine-worker cold start"


def record_cold_start(
    started_at_ms: int,
    cold_start_s: float,
    phases_s: dict[str, float],
    worker_id: str,
    engine: str,
    model: str,
    site: RunSite,
    tracer: trace.Tracer | None = None,
) -> None:
    """End a span over [started_at_ms, started_at_ms + cold_start_s]: the worker, where it runs, the phases."""
    tracer = tracer or trace.get_tracer("llmbus.engine_worker")
    start_ns = started_at_ms * 1_000_000
    span = tracer.start_span(SPAN_NAME, kind=trace.SpanKind.INTERNAL, start_time=start_ns)
    where = {
        sc.LLMBUS_NODE_ID: site.node_id,
        sc.LLMBUS_GPU: site.gpu,
        sc.LLMBUS_MODEL_VERSION: site.model_version,
        sc.LLMBUS_MODEL_FORMAT: site.model_format,
    }
    span.set_attributes({sc.LLMBUS_WORKER_ID: worker_id, sc.LLMBUS_ENGINE: engine, sc.LLMBUS_MODEL: model})
    span.set_attributes({name: value for name, value in where.items() if value is not None})
    span.set_attribute(sc.LLMBUS_COLD_START_S, cold_start_s)
    for phase, seconds in phases_s.items():
        span.set_attribute(f"{sc.LLMBUS_COLD_START_PHASE_PREFIX}{phase}_s", seconds)
    span.end(end_time=start_ns + round(cold_start_s * 1e9))
