"""W3C trace context to and from Kafka header bytes, without the propagator on the common path.

Every record carries a `traceparent`, so OpenTelemetry's general propagation (the global
propagator, each of its parts in turn, a carrier dict, a regex, strings then bytes) ran for
every record produced and consumed: several µs each. When the propagator is the W3C one
(the default, `OTEL_PROPAGATORS=tracecontext,baggage`) the common cases are done here
directly and give exactly what the propagator gives: writing a context without baggage,
and reading a version-00 `traceparent` without `tracestate`. Everything else (baggage, a
tracestate to read, another header version, a malformed header, another propagator) still
goes through the propagator.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.propagate import get_global_textmap
from opentelemetry.propagators.textmap import TextMapPropagator

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

TraceHeaders = Sequence[tuple[str, bytes]]

_W3C_FIELDS = frozenset({TRACEPARENT, TRACESTATE, "baggage"})
_LOWER_HEX = b"0123456789abcdef"
_VERSION_00_LENGTH = len("00-") + 32 + len("-") + 16 + len("-") + 2
_DASH = ord("-")


@functools.cache
def _writes_w3c_trace_context(propagator: TextMapPropagator) -> bool:
    """The propagator is W3C trace context, with or without W3C baggage (asked once per propagator)."""
    fields = propagator.fields
    return TRACEPARENT in fields and fields <= _W3C_FIELDS


@functools.lru_cache(maxsize=4096)
def _traceparent_bytes(trace_id: int, span_id: int, trace_flags: int) -> bytes:
    """The header of one span context: made once, then reused for every record sent under it."""
    return f"00-{trace_id:032x}-{span_id:016x}-{trace_flags:02x}".encode()


def outgoing_trace_headers() -> TraceHeaders:
    """The current context as headers, as the global propagator would write them."""
    context = otel_context.get_current()
    propagator = get_global_textmap()
    if not _writes_w3c_trace_context(propagator) or baggage.get_all(context):
        return _injected(propagator, context)
    span_context = trace.get_current_span(context).get_span_context()
    if span_context == trace.INVALID_SPAN_CONTEXT:  # the propagator's own test: nothing to carry
        return ()
    traceparent = (
        TRACEPARENT,
        _traceparent_bytes(span_context.trace_id, span_context.span_id, span_context.trace_flags),
    )
    if span_context.trace_state:
        return (traceparent, (TRACESTATE, span_context.trace_state.to_header().encode()))
    return (traceparent,)


def _injected(propagator: TextMapPropagator, context: otel_context.Context) -> TraceHeaders:
    carrier: dict[str, str] = {}
    propagator.inject(carrier, context)
    return [(key, value.encode()) for key, value in carrier.items()]


def incoming_trace_context(traceparent: bytes | None, tracestate: bytes | None) -> otel_context.Context:
    """The producer's context from its trace headers (an empty context when there is none)."""
    if tracestate is None and _writes_w3c_trace_context(get_global_textmap()):
        if traceparent is None:
            return otel_context.Context()
        span_context = _version_00_span_context(traceparent)
        if span_context is not None:
            return trace.set_span_in_context(trace.NonRecordingSpan(span_context), otel_context.Context())
    return _extracted(traceparent, tracestate)


def _version_00_span_context(traceparent: bytes) -> trace.SpanContext | None:
    """A well-formed version-00 header's span context; None for anything the propagator must judge."""
    if len(traceparent) != _VERSION_00_LENGTH or not traceparent.startswith(b"00-"):
        return None
    # Lowercase hex but for the three dashes, and those where the fields end.
    if traceparent.translate(None, _LOWER_HEX) != b"---" or traceparent[35] != _DASH or traceparent[52] != _DASH:
        return None
    trace_id, span_id = int(traceparent[3:35], 16), int(traceparent[36:52], 16)
    if not trace_id or not span_id:
        return None
    return trace.SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=trace.TraceFlags(int(traceparent[53:55], 16)),
        trace_state=None,
    )


def _extracted(traceparent: bytes | None, tracestate: bytes | None) -> otel_context.Context:
    """The propagator's reading: header values that are not UTF-8 count as absent."""
    carrier: dict[str, str] = {}
    for key, raw in ((TRACEPARENT, traceparent), (TRACESTATE, tracestate)):
        if raw is None:
            continue
        try:
            carrier[key] = raw.decode()
        except UnicodeDecodeError:
            continue
    return get_global_textmap().extract(carrier)
