"""With tracing off no spans are made per record or message, and the trace context still travels."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.structs import ConsumerRecord
from opentelemetry import trace

from llmbus.bus import consumer, producer
from llmbus.bus import headers as hdr
from llmbus.bus.producer import Publisher
from llmbus.contract.messages import TokenChunk

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-00"  # unsampled, as the off provider makes them


class _CapturingProducer:
    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []

    async def send(self, topic: str, value: bytes, **kwargs: object) -> asyncio.Future[None]:
        self.sent.append({"topic": topic, **kwargs})
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


@pytest.fixture
def tracing_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumer, "tracing_off", lambda: True)
    monkeypatch.setattr(producer, "tracing_off", lambda: True)


def _record() -> ConsumerRecord:
    headers = [(hdr.TRACEPARENT, PARENT.encode()), (hdr.REQUEST_ID, b"r1")]
    return ConsumerRecord("llm.routed", 0, 5, 0, 0, b"k", b"{}", None, 1, 2, headers)


async def test_a_record_is_handled_in_its_producers_trace_without_a_span(tracing_is_off: None) -> None:
    record = _record()
    with consumer.ConsumerLoop._record_context(None, record, "r1"):  # type: ignore[arg-type]
        current = trace.get_current_span()
        assert f"{current.get_span_context().trace_id:032x}" == TRACE_ID
        assert not current.is_recording()
    assert not trace.get_current_span().get_span_context().is_valid  # detached afterwards


async def test_what_a_handler_publishes_carries_the_records_trace_id(tracing_is_off: None) -> None:
    fake = _CapturingProducer()
    publisher = Publisher(fake, "worker", send_timeout_s=1.0)  # type: ignore[arg-type]
    with consumer.ConsumerLoop._record_context(None, _record(), "r1"):  # type: ignore[arg-type]
        await publisher.publish("llm.tokens", TokenChunk(request_id="r1", tenant="t", seq=0, delta="hi"), key="r1")
    headers = dict(fake.sent[0]["headers"])  # type: ignore[call-overload]
    assert headers[hdr.TRACEPARENT].decode().split("-")[1] == TRACE_ID
    assert headers[hdr.REQUEST_ID] == b"r1"
