"""Kafka headers every llmbus message carries: schema, request id, tenant, W3C trace context."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from opentelemetry import context as otel_context
from opentelemetry.propagate import extract, inject

from llmbus.messages import Message

SCHEMA = "llmbus-schema"
REQUEST_ID = "llmbus-request-id"
TENANT = "llmbus-tenant"
PRODUCER = "llmbus-producer"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

KafkaHeaders = list[tuple[str, bytes]]


def outgoing(value: Message, service: str, request_id: str | None = None, tenant: str | None = None) -> KafkaHeaders:
    """Headers for a message published now, carrying the current span as `traceparent`."""
    carrier: dict[str, str] = {}
    inject(carrier)
    headers: KafkaHeaders = [(SCHEMA, value.schema_name().encode()), (PRODUCER, service.encode())]
    request_id = request_id or getattr(value, "request_id", None)
    tenant = tenant or getattr(value, "tenant", None)
    if request_id:
        headers.append((REQUEST_ID, str(request_id).encode()))
    if tenant:
        headers.append((TENANT, str(tenant).encode()))
    headers.extend((k, v.encode()) for k, v in carrier.items())
    return headers


def as_dict(headers: Sequence[tuple[str, bytes]] | None) -> dict[str, str]:
    result: dict[str, str] = {}
    for key, raw in headers or ():
        try:
            result[key] = raw.decode() if raw is not None else ""
        except UnicodeDecodeError:
            continue
    return result


def trace_context(headers: Iterable[tuple[str, bytes]] | None) -> otel_context.Context:
    """The OpenTelemetry context of the producer of a record (an empty one when absent)."""
    carrier = {k: v for k, v in as_dict(list(headers or ())).items() if k in (TRACEPARENT, TRACESTATE)}
    return extract(carrier)
