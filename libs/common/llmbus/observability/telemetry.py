"""Structured logs that carry the request id, and OpenTelemetry tracing set-up."""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import time
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased

from llmbus.settings import BusSettings

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

# What `setup_tracing` installs when spans have nowhere to go: nothing is ever sampled.
_OFF_PROVIDER = TracerProvider(sampler=ALWAYS_OFF)


def tracing_off() -> bool:
    """True when this process records no spans at all (setup_tracing found no destination).

    Per-record work that only feeds spans (a consumer span per record) is skipped then; the
    trace context still travels from message to message.
    """
    return trace.get_tracer_provider() is _OFF_PROVIDER


class _JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": round(time.time(), 3),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if (rid := request_id_var.get()) is not None:
            entry["request_id"] = rid
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            entry["trace_id"] = f"{span.trace_id:032x}"
        for key, value in getattr(record, "fields", {}).items():
            entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(service: str, level: str = "INFO", as_json: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if as_json:
        handler.setFormatter(_JsonFormatter(service))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.WARNING)


def setup_tracing(service: str, settings: BusSettings | None = None, *, console: bool = False) -> bool:
    """Install a tracer provider when spans have somewhere to go; True if tracing is on.

    Destinations: OTLP (OTEL_EXPORTER_OTLP_ENDPOINT, the standard variable), the console, a
    JSON-lines file. With none, spans are never sampled (nothing is recorded or exported), but
    every message still carries a `traceparent`: the client's trace id when it sent one, else a
    new one, so a request can be followed across the topics whether or not tracing is on.
    """
    settings = settings or BusSettings()
    console = console or settings.otel_console
    otlp = bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    if not (otlp or console or settings.trace_file):
        trace.set_tracer_provider(_OFF_PROVIDER)
        return False
    sampler = ParentBased(TraceIdRatioBased(settings.trace_sample_ratio))
    provider = TracerProvider(resource=Resource.create({"service.name": f"llmbus-{service}"}), sampler=sampler)
    if otlp:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:  # exporter is optional; without it spans stay in process
            logging.getLogger(__name__).warning("OTLP endpoint set but opentelemetry-exporter-otlp is not installed")
        else:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if console:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    if settings.trace_file:
        # Written as each span ends: a killed process loses nothing (a test reads these files).
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(settings.trace_file)))
    trace.set_tracer_provider(provider)
    return True


class JsonLinesSpanExporter(SpanExporter):
    """One JSON object per finished span: ids, parent, name, kind, service and attributes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                ctx = span.get_span_context()
                entry = {
                    "trace_id": f"{ctx.trace_id:032x}" if ctx else None,
                    "span_id": f"{ctx.span_id:016x}" if ctx else None,
                    "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                    "name": span.name,
                    "kind": span.kind.name,
                    "service": span.resource.attributes.get("service.name"),
                    "start_ns": span.start_time,
                    "end_ns": span.end_time,
                    "attributes": dict(span.attributes or {}),
                }
                out.write(json.dumps(entry, default=str) + "\n")
        return SpanExportResult.SUCCESS
