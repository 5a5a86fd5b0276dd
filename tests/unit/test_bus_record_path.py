"""The per-record path of the bus after its fixed costs were cut: same series, same spans, same headers."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY, Counter

from llmbus.bus import consumer, producer
from llmbus.bus import headers as hdr
from llmbus.bus.consumer import ConsumerLoop
from llmbus.bus.message_metrics import observe_published
from llmbus.bus.producer import Publisher
from llmbus.contract.messages import InferenceResult, TokenChunk
from llmbus.observability.metric_children import MODEL_LABELS, children_of
from llmbus.settings import BusSettings

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7


class _CapturingProducer:
    def __init__(self) -> None:
        self.headers: list[dict[str, bytes]] = []

    async def send(self, topic: str, value: bytes, **kwargs: object) -> asyncio.Future[None]:
        self.headers.append(dict(kwargs["headers"]))  # type: ignore[call-overload]
        delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        delivery.set_result(None)
        return delivery


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """Tracing on and every span kept, without touching the process's global tracer provider."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for module in (consumer, producer):
        monkeypatch.setattr(module, "tracer", provider.get_tracer("llmbus.bus"))
        monkeypatch.setattr(module, "tracing_off", lambda: False)
    return exporter


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _record(topic: str, offset: int, sampled: bool = True) -> ConsumerRecord:
    traceparent = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-{'01' if sampled else '00'}".encode()
    headers = [(hdr.REQUEST_ID, b"r1"), (hdr.TRACEPARENT, traceparent)]
    return ConsumerRecord(topic, 0, offset, 0, 0, b"k", b"{}", None, 1, 2, headers)


def _loop(handler: consumer.Handler, on_error: consumer.ErrorHandler, service: str) -> ConsumerLoop:
    return ConsumerLoop(None, handler, on_error, BusSettings(), service=service)  # type: ignore[arg-type]


async def _handled(loop: ConsumerLoop, record: ConsumerRecord) -> None:
    tp = TopicPartition(record.topic, record.partition)
    loop._tracker.started(tp, record.offset)
    await loop._handle(tp, record, 0)


def test_a_remembered_child_is_the_metrics_own_and_typed() -> None:
    counter = Counter("llmbus_test_children_total", "test", ["flag"])
    child = children_of(counter)
    child("True").inc()
    child(True).inc(2)  # a bool and its text are one series; 1 is another
    child(1).inc(5)
    assert child("True") is counter.labels("True")
    assert _value("llmbus_test_children_total", flag="True") == 3
    assert _value("llmbus_test_children_total", flag="1") == 5


async def test_each_outcome_counts_under_its_own_labels() -> None:
    async def ok(_: ConsumerRecord) -> None:
        return None

    async def fails(_: ConsumerRecord) -> None:
        raise ValueError("bad")

    async def dead_letter(_: ConsumerRecord, __: Exception) -> None:
        return None

    labels = {"service": "svc-a", "topic": "test.outcomes"}
    before = {o: _value("llmbus_messages_consumed_total", **labels, outcome=o) for o in ("ok", "dead_letter")}
    handled_before = _value("llmbus_handler_seconds_count", **labels)
    await _handled(_loop(ok, dead_letter, "svc-a"), _record("test.outcomes", 1))
    await _handled(_loop(ok, dead_letter, "svc-a"), _record("test.outcomes", 2))
    await _handled(_loop(fails, dead_letter, "svc-a"), _record("test.outcomes", 3))
    await _handled(_loop(ok, dead_letter, "svc-b"), _record("test.outcomes", 4))
    assert _value("llmbus_messages_consumed_total", **labels, outcome="ok") == before["ok"] + 2
    assert _value("llmbus_messages_consumed_total", **labels, outcome="dead_letter") == before["dead_letter"] + 1
    assert _value("llmbus_handler_seconds_count", **labels) == handled_before + 3


async def test_a_sampled_record_gets_its_span_and_what_it_publishes_carries_the_trace(
    spans: InMemorySpanExporter,
) -> None:
    sent = _CapturingProducer()
    publisher = Publisher(sent, "svc-p", send_timeout_s=1.0)  # type: ignore[arg-type]

    async def publish_two(_: ConsumerRecord) -> None:
        await publisher.publish("test.out", TokenChunk(request_id="r1", tenant="t", seq=0, delta="a"), key="r1")
        await publisher.publish(
            "test.out", TokenChunk(request_id="r1", tenant="t", seq=1, delta="b"), key="r1", wait=False
        )

    async def never(_: ConsumerRecord, exc: Exception) -> None:
        raise exc

    published_before = _value("llmbus_messages_published_total", service="svc-p", topic="test.out")
    await _handled(_loop(publish_two, never, "svc-c"), _record("test.in", 7))
    finished = {span.name: span for span in spans.get_finished_spans()}
    process, publish = finished["test.in process"], finished["test.out publish"]
    assert process.parent is not None and process.parent.span_id == SPAN_ID
    assert process.context.trace_id == TRACE_ID and process.context.trace_flags.sampled
    assert publish.parent is not None and publish.parent.span_id == process.context.span_id
    published = [headers[hdr.TRACEPARENT].decode().split("-") for headers in sent.headers]
    assert published[0][1:] == [f"{TRACE_ID:032x}", f"{publish.context.span_id:016x}", "01"]  # its own span
    assert published[1][1:] == [f"{TRACE_ID:032x}", f"{process.context.span_id:016x}", "01"]  # send: no span
    assert _value("llmbus_messages_published_total", service="svc-p", topic="test.out") == published_before + 2


def test_result_series_count_under_the_results_labels() -> None:
    result = InferenceResult.model_validate(
        {
            "request_id": "r1",
            "tenant": "t",
            "status": "ok",
            "model": "m-children",
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 12, "completion_tokens": 16},
            "timings": {"ttft_ms": 5.0, "total_ms": 20.0},
        }
    )
    MODEL_LABELS.learn(["m-children"])  # known to this process (else it counts as `other`)
    labels = {"service": "svc-r", "model": "m-children", "status": "ok", "code": "", "finished_reason": "stop"}
    for _ in range(2):
        observe_published("svc-r", result)
    assert _value("llmbus_request_results_total", **labels, shadow="false") == 2
    assert _value("llmbus_request_generation_tokens_total", model="m-children") == 32
    assert _value("llmbus_request_time_to_first_token_seconds_count", model="m-children") == 2
    assert _value("llmbus_request_queue_time_seconds_count", model="m-children") == 0
