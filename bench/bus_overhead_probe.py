"""One side of bus_overhead_bench: CPU µs per call of the bus library's per-record functions.

    python -m bench.bus_overhead_probe --tracing off|sampled --calls 20000 --repeats 5

Imports `llmbus` from whatever PYTHONPATH gives (the bench runs it once against the tree under
test and once against the baseline commit), so it calls only what both have: `headers.outgoing`,
`headers.trace_context`, `codec.decode`, `ConsumerLoop._handle`, `Publisher.send`, `Publisher.publish`.
Prints one JSON object: {case: [µs per call of each repeat]}. No broker: the producer is a fake
whose send returns an already acknowledged future, the handler does nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable

import uvloop
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from llmbus.bus import headers as hdr
from llmbus.bus.codec import decode
from llmbus.bus.consumer import ConsumerLoop
from llmbus.bus.producer import Publisher, make_producer
from llmbus.contract.messages import InferenceResult, TokenChunk
from llmbus.observability.telemetry import setup_tracing
from llmbus.settings import BusSettings

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7
SERVICE = "engine-worker"
TOPIC = "llm.tokens"


class FakeProducer:
    """aiokafka's producer as Publisher sees it: `send` enqueues and returns the delivery future."""

    async def send(self, topic: str, value: bytes, **_: object) -> asyncio.Future[object]:
        delivery: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        delivery.set_result(None)
        return delivery


class FakeConsumer:
    """Nothing of the consumer is touched while a record is handled."""


def set_up_tracing(mode: str) -> None:
    if mode == "off":
        setup_tracing("bench", BusSettings(trace_file=None, otel_console=False))
    else:  # every span recorded (no exporter: what is measured is the bus, not an exporter)
        trace.set_tracer_provider(TracerProvider(sampler=ALWAYS_ON))


def producer_context(mode: str) -> otel_context.Context:
    """What is current while a service publishes: the record's context (tracing off) or its span."""
    flags = trace.TraceFlags(trace.TraceFlags.SAMPLED if mode == "sampled" else trace.TraceFlags.DEFAULT)
    remote = trace.SpanContext(TRACE_ID, SPAN_ID, is_remote=True, trace_flags=flags)
    parent = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    if mode == "off":
        return parent
    span = trace.get_tracer("bench").start_span("handle", context=parent)
    return trace.set_span_in_context(span, parent)


def record_headers(mode: str) -> list[tuple[str, bytes]]:
    flags = "01" if mode == "sampled" else "00"
    return [
        (hdr.SCHEMA, b"TokenChunk/1"),
        (hdr.PRODUCER, SERVICE.encode()),
        (hdr.REQUEST_ID, b"5f1c0e9a2b7d4c3e8f6a1b2c3d4e5f60"),
        (hdr.TENANT, b"acme"),
        (hdr.TRACEPARENT, f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-{flags}".encode()),
    ]


def chunk() -> TokenChunk:
    return TokenChunk(request_id="5f1c0e9a2b7d4c3e8f6a1b2c3d4e5f60", tenant="acme", seq=3, delta="abcd", tokens=4)


def result() -> InferenceResult:
    return InferenceResult.model_validate(
        {
            "request_id": "5f1c0e9a2b7d4c3e8f6a1b2c3d4e5f60",
            "tenant": "acme",
            "status": "ok",
            "model": "llama-3.1-8b",
            "worker_id": "w1",
            "text": "hello",
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 12, "completion_tokens": 16},
            "timings": {"queued_ms": 1.0, "ttft_ms": 5.0, "total_ms": 20.0},
        }
    )


def cpu_us(run: Callable[[int], None], calls: int, repeats: int) -> list[float]:
    run(max(1, calls // 10))  # warm caches and lazily created metric children
    timings = []
    for _ in range(repeats):
        start = time.process_time()
        run(calls)
        timings.append((time.process_time() - start) / calls * 1e6)
    return [round(t, 3) for t in timings]


def in_loop(step: Callable[[], Awaitable[object]], context: otel_context.Context) -> Callable[[int], None]:
    """`calls` awaits of `step` on one event loop, inside `context`, letting callbacks run every 64."""

    async def many(calls: int) -> None:
        token = otel_context.attach(context)
        try:
            for i in range(calls):
                await step()
                if i % 64 == 63:
                    await asyncio.sleep(0)
        finally:
            otel_context.detach(token)
        await asyncio.sleep(0)

    loop = uvloop.new_event_loop()  # what run_service runs services on
    return lambda calls: loop.run_until_complete(many(calls))


def in_context(step: Callable[[], object], context: otel_context.Context) -> Callable[[int], None]:
    def many(calls: int) -> None:
        token = otel_context.attach(context)
        try:
            for _ in range(calls):
                step()
        finally:
            otel_context.detach(token)

    return many


def producer_partitioner() -> Callable[[bytes | None, list[int], list[int]], int]:
    """The partitioner of the producer services get from make_producer (aiokafka keeps it as `_partitioner`)."""

    async def made() -> Callable[[bytes | None, list[int], list[int]], int]:
        producer = make_producer(BusSettings(), "bench")  # never started: nothing is connected
        await producer.stop()
        return producer._partitioner  # type: ignore[no-any-return]

    return asyncio.run(made())


def sends_through_aiokafka(context: otel_context.Context, message: TokenChunk) -> Callable[[int], None]:
    """Publisher.send over make_producer's own producer, never started: the topic's partitions are
    given in place of fetched metadata and nothing is flushed, so each send is the bus library's
    work plus aiokafka's enqueue (partitioner, serialisation, batch append) and nothing else."""
    keys = [f"{i:032x}" for i in range(8)]  # a worker's requests in flight, several chunks each
    partitions = {0, 1, 2, 3, 4, 5}
    sent = itertools.count()
    publishers: list[Publisher] = []

    async def known_metadata(topic: str) -> set[int]:
        return partitions

    def publisher() -> Publisher:
        if not publishers:  # made on the loop that runs the sends (aiokafka binds to it)
            producer = make_producer(BusSettings(max_batch_bytes=2**30, max_message_bytes=2**30), "bench")
            producer.client._wait_on_metadata = known_metadata
            producer.client.cluster.partitions_for_topic = lambda topic: partitions
            producer.client.cluster.available_partitions_for_topic = lambda topic: partitions
            publishers.append(Publisher(producer, SERVICE, send_timeout_s=5.0))
        return publishers[0]

    return in_loop(lambda: publisher().publish(TOPIC, message, key=keys[next(sent) % len(keys)], wait=False), context)


def cases(mode: str) -> dict[str, Callable[[int], None]]:
    context = producer_context(mode)
    headers = record_headers(mode)
    message, final = chunk(), result()
    publisher = Publisher(FakeProducer(), SERVICE, send_timeout_s=5.0)  # type: ignore[arg-type]

    async def no_op(_: ConsumerRecord) -> None:
        return None

    async def never(_: ConsumerRecord, exc: Exception) -> None:
        raise exc

    consumer_loop = ConsumerLoop(
        FakeConsumer(),  # type: ignore[arg-type]
        no_op,
        never,
        BusSettings(),
        service="scheduler",
        max_in_flight=64,
    )
    tp = TopicPartition("llm.routed", 0)
    offsets = iter(range(10**9))
    encoded = ConsumerRecord(TOPIC, 0, 0, 0, 0, None, message.to_bytes(), None, 0, 0, headers)

    async def handle_one() -> None:
        offset = next(offsets)
        record = ConsumerRecord("llm.routed", 0, offset, 0, 0, None, b"{}", None, 0, 2, headers)
        consumer_loop._tracker.started(tp, offset)  # what ConsumerLoop._start does before the task
        await consumer_loop._handle(tp, record, 0)

    partitioner = producer_partitioner()
    keys = [f"{i:032x}".encode() for i in range(8)]  # a worker's requests in flight, several records each
    partitions = list(range(6))

    new_keys = (f"{i:032x}".encode() for i in itertools.count(10**6))

    def partition_seen_keys() -> None:
        for key in keys:
            partitioner(key, partitions, partitions)

    async def bounded_nothing() -> None:
        async with asyncio.timeout(5.0):  # noqa: ASYNC100 - its own cost is what is measured
            pass

    return {
        "partitioner, a key seen before": lambda calls: in_context(partition_seen_keys, context)(calls // len(keys)),
        "partitioner, a new key": in_context(lambda: partitioner(next(new_keys), partitions, partitions), context),
        "headers.outgoing": in_context(lambda: hdr.outgoing(message, SERVICE), context),
        "headers.trace_context": in_context(lambda: hdr.trace_context(headers), otel_context.Context()),
        "codec.decode (TokenChunk)": in_context(lambda: decode(encoded, TokenChunk), otel_context.Context()),
        "ConsumerLoop._handle": in_loop(handle_one, otel_context.Context()),
        "Publisher.publish(wait=False) (TokenChunk)": in_loop(
            lambda: publisher.publish(TOPIC, message, key="k", wait=False), context
        ),
        "Publisher.publish(wait=False) (TokenChunk) through aiokafka's producer": sends_through_aiokafka(
            context, message
        ),
        "asyncio.timeout, for scale (one per send and publish)": in_loop(bounded_nothing, context),
        "Publisher.publish (InferenceResult)": in_loop(
            lambda: publisher.publish("llm.results", final, key="k"), context
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracing", choices=("off", "sampled"), default="off")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    set_up_tracing(args.tracing)
    print(json.dumps({name: cpu_us(run, args.calls, args.repeats) for name, run in cases(args.tracing).items()}))


if __name__ == "__main__":
    main()
