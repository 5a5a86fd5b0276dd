"""Kafka headers every llmbus message carries: schema, request id, tenant, W3C trace context (and the
upgrade id of a release's records, so a consumer's span says which release it handled)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from opentelemetry import context as otel_context

from llmbus.bus.trace_headers import TRACEPARENT, TRACESTATE, incoming_trace_context, outgoing_trace_headers
from llmbus.contract.cloudevents import cloudevent_headers
from llmbus.contract.messages import Message

SCHEMA = "llmbus-schema"
REQUEST_ID = "llmbus-request-id"
TENANT = "llmbus-tenant"
PRODUCER = "llmbus-producer"
UPGRADE_ID = "llmbus-upgrade-id"

__all__ = [
    "PRODUCER",
    "REQUEST_ID",
    "SCHEMA",
    "TENANT",
    "TRACEPARENT",
    "TRACESTATE",
    "UPGRADE_ID",
    "KafkaHeaders",
    "as_dict",
    "header_value",
    "outgoing",
    "trace_context",
    "trace_headers_now",
]

KafkaHeaders = list[tuple[str, bytes]]


@functools.cache
def _schema_header(message_type: type[Message]) -> tuple[str, bytes]:
    return (SCHEMA, message_type.schema_name().encode())


@functools.cache
def _producer_header(service: str) -> tuple[str, bytes]:
    return (PRODUCER, service.encode())


def outgoing(
    value: Message | None,
    service: str,
    request_id: str | None = None,
    tenant: str | None = None,
    trace: Iterable[tuple[str, bytes]] | None = None,
) -> KafkaHeaders:
    """Headers for a message published now, carrying the current span as `traceparent` (or `trace`:
    the trace headers taken once for many records published in the same context). A tombstone
    (`value` None) has no schema."""
    if value is None:
        return [_producer_header(service), *(outgoing_trace_headers() if trace is None else trace)]
    headers: KafkaHeaders = [_schema_header(type(value)), _producer_header(service)]
    request_id = request_id or getattr(value, "request_id", None)
    tenant = tenant or getattr(value, "tenant", None)
    if request_id:
        headers.append((REQUEST_ID, str(request_id).encode()))
    if tenant:
        headers.append((TENANT, str(tenant).encode()))
    if (upgrade_id := _upgrade_id(value)) is not None:
        headers.append((UPGRADE_ID, upgrade_id.encode()))
    headers.extend(outgoing_trace_headers() if trace is None else trace)
    headers.extend(cloudevent_headers(value, service))  # ce_* on what analytics reads (CloudEvents binary mode)
    return headers


def _upgrade_id(value: Message) -> str | None:
    """The upgrade id of a release's record (a Dispatch's is its routed request's)."""
    release = getattr(value, "release", None)
    if release is None and (routed := getattr(value, "routed", None)) is not None:
        release = routed.release
    return release.upgrade_id if release is not None else None


def trace_headers_now() -> tuple[tuple[str, bytes], ...]:
    """The current trace context as headers, once, for `outgoing(..., trace=...)` of many records."""
    return tuple(outgoing_trace_headers())


def as_dict(headers: Sequence[tuple[str, bytes]] | None) -> dict[str, str]:
    result: dict[str, str] = {}
    for key, raw in headers or ():
        try:
            result[key] = raw.decode() if raw is not None else ""
        except UnicodeDecodeError:
            continue
    return result


def header_value(headers: Sequence[tuple[str, bytes]] | None, name: str) -> str | None:
    """The first `name` header as text (None when absent or not UTF-8)."""
    for key, raw in headers or ():
        if key == name and raw is not None:
            try:
                return raw.decode()
            except UnicodeDecodeError:
                return None
    return None


def trace_context(headers: Iterable[tuple[str, bytes]] | None) -> otel_context.Context:
    """The OpenTelemetry context of the producer of a record (an empty one when absent)."""
    traceparent = tracestate = None
    for key, raw in headers or ():  # the last of a repeated header wins, as it always did
        if key == TRACEPARENT:
            traceparent = raw
        elif key == TRACESTATE:
            tracestate = raw
    return incoming_trace_context(traceparent, tracestate)
