"""Trace headers made and read without the propagator give exactly what the propagator gives."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.propagators.textmap import DefaultGetter, DefaultSetter, TextMapPropagator
from opentelemetry.trace.span import TraceState

from llmbus.bus import headers as hdr
from llmbus.bus import trace_headers
from llmbus.bus.trace_headers import incoming_trace_context, outgoing_trace_headers

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7
trace_ids = st.integers(min_value=1, max_value=2**128 - 1)
span_ids = st.integers(min_value=1, max_value=2**64 - 1)
flags = st.sampled_from([0, 1, 2, 0xFF])


def _current(span_context: trace.SpanContext, **entries: str) -> otel_context.Context:
    context = trace.set_span_in_context(trace.NonRecordingSpan(span_context))
    for name, value in entries.items():
        context = baggage.set_baggage(name, value, context)
    return context


def _as_propagator_writes(context: otel_context.Context) -> list[tuple[str, bytes]]:
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context)
    return [(key, value.encode()) for key, value in carrier.items()]


def _written(context: otel_context.Context) -> list[tuple[str, bytes]]:
    token = otel_context.attach(context)
    try:
        return list(outgoing_trace_headers())
    finally:
        otel_context.detach(token)


def _span_context_of(context: otel_context.Context) -> trace.SpanContext:
    return trace.get_current_span(context).get_span_context()


def _as_propagator_reads(traceparent: bytes | None, tracestate: bytes | None = None) -> trace.SpanContext:
    headers = [(key, raw) for key, raw in ((hdr.TRACEPARENT, traceparent), (hdr.TRACESTATE, tracestate)) if raw]
    return _span_context_of(propagate.extract(hdr.as_dict(headers)))


@given(trace_ids, span_ids, flags)
def test_written_headers_are_the_propagators(trace_id: int, span_id: int, trace_flags: int) -> None:
    span_context = trace.SpanContext(trace_id, span_id, is_remote=False, trace_flags=trace.TraceFlags(trace_flags))
    context = _current(span_context)
    assert _written(context) == _as_propagator_writes(context)


def test_the_remembered_traceparent_follows_the_current_span() -> None:
    first = trace.SpanContext(TRACE_ID, SPAN_ID, is_remote=False)
    second = trace.SpanContext(TRACE_ID, SPAN_ID + 1, is_remote=False, trace_flags=trace.TraceFlags(1))
    written = [dict(_written(_current(span_context)))[hdr.TRACEPARENT] for span_context in (first, second, first)]
    assert written == [
        f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-00".encode(),
        f"00-{TRACE_ID:032x}-{SPAN_ID + 1:016x}-01".encode(),
        f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-00".encode(),
    ]


def test_tracestate_and_baggage_are_written_as_the_propagator_writes_them() -> None:
    state = TraceState([("vendor", "value")])
    context = _current(trace.SpanContext(TRACE_ID, SPAN_ID, is_remote=False, trace_state=state), user="u1")
    written = dict(_written(context))
    assert written == dict(_as_propagator_writes(context))
    assert written[hdr.TRACESTATE] == b"vendor=value" and written["baggage"] == b"user=u1"


def test_nothing_is_written_outside_any_trace() -> None:
    assert _written(otel_context.Context()) == []


class _OtherPropagator(TextMapPropagator):
    """A non-W3C propagator: the fast paths must step aside for it."""

    def extract(self, carrier, context=None, getter=DefaultGetter()):  # type: ignore[no-untyped-def]
        return otel_context.Context()

    def inject(self, carrier, context=None, setter=DefaultSetter()):  # type: ignore[no-untyped-def]
        setter.set(carrier, "x-other", "1")

    @property
    def fields(self) -> set[str]:
        return {"x-other"}


def test_another_propagator_is_used_when_configured() -> None:
    default = propagate.get_global_textmap()
    propagate.set_global_textmap(_OtherPropagator())
    try:
        assert _written(_current(trace.SpanContext(TRACE_ID, SPAN_ID, is_remote=False))) == [("x-other", b"1")]
        traceparent = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01".encode()
        assert not _span_context_of(incoming_trace_context(traceparent, None)).is_valid
    finally:
        propagate.set_global_textmap(default)


@given(trace_ids, span_ids, flags)
def test_a_well_formed_traceparent_reads_as_the_propagator_reads_it(trace_id: int, span_id: int, f: int) -> None:
    traceparent = f"00-{trace_id:032x}-{span_id:016x}-{f:02x}".encode()
    read = _span_context_of(hdr.trace_context([(hdr.SCHEMA, b"X/1"), (hdr.TRACEPARENT, traceparent)]))
    assert read == _as_propagator_reads(traceparent)
    assert (read.trace_id, read.span_id, read.trace_flags, read.is_remote) == (trace_id, span_id, f, True)


MALFORMED = [
    b"",
    b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01",  # zero trace id
    f"00-{TRACE_ID:032x}-{0:016x}-01".encode(),  # zero span id
    f"00-{TRACE_ID:032X}-{SPAN_ID:016x}-01".encode(),  # uppercase
    f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01-extra".encode(),  # version 00 has no more fields
    f"01-{TRACE_ID:032x}-{SPAN_ID:016x}-01-extra".encode(),  # a later version may: the propagator reads it
    f"ff-{TRACE_ID:032x}-{SPAN_ID:016x}-01".encode(),  # forbidden version
    f" 00-{TRACE_ID:032x}-{SPAN_ID:016x}-01".encode(),  # leading blank: the propagator accepts it
    f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-0g".encode(),
    f"00_{TRACE_ID:032x}-{SPAN_ID:016x}-01".encode(),
    f"00-+{TRACE_ID:031x}-{SPAN_ID:016x}-01".encode(),  # int() would take a sign: not hex
    f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01".encode().replace(b"4b", b"\xff\xfe"),  # not UTF-8
]


@pytest.mark.parametrize("traceparent", MALFORMED)
def test_a_malformed_traceparent_is_judged_by_the_propagator(traceparent: bytes) -> None:
    assert _span_context_of(incoming_trace_context(traceparent, None)) == _as_propagator_reads(traceparent)


@given(st.binary(min_size=50, max_size=60))
def test_any_bytes_read_as_the_propagator_reads_them(traceparent: bytes) -> None:
    assert _span_context_of(incoming_trace_context(traceparent, None)) == _as_propagator_reads(traceparent)


def test_a_tracestate_is_read_with_its_traceparent() -> None:
    traceparent = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01".encode()
    headers = [(hdr.TRACEPARENT, traceparent), (hdr.TRACESTATE, b"vendor=value")]
    read = _span_context_of(hdr.trace_context(headers))
    assert read == _as_propagator_reads(traceparent, b"vendor=value")
    assert read.trace_state.get("vendor") == "value"


def test_no_trace_headers_read_as_an_empty_context() -> None:
    assert hdr.trace_context(None) == otel_context.Context()
    assert hdr.trace_context([(hdr.REQUEST_ID, b"r1")]) == otel_context.Context()


def test_the_common_cases_do_not_go_through_the_propagator(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("went through the propagator")

    monkeypatch.setattr(trace_headers, "_injected", refuse)
    monkeypatch.setattr(trace_headers, "_extracted", refuse)
    (written,) = _written(_current(trace.SpanContext(TRACE_ID, SPAN_ID, is_remote=False)))
    assert _span_context_of(incoming_trace_context(written[1], None)).span_id == SPAN_ID
    assert incoming_trace_context(None, None) == otel_context.Context()
