"""Producer factory with safe defaults, and a Publisher that bounds every send."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractContextManager, nullcontext

from aiokafka import AIOKafkaProducer
from opentelemetry import trace
from prometheus_client import Counter

from llmbus import semconv
from llmbus.bus import headers as hdr
from llmbus.bus.message_metrics import observe_published
from llmbus.bus.security import kafka_auth
from llmbus.bus.span_attrs import message_attributes
from llmbus.messages import Message
from llmbus.settings import BusSettings
from llmbus.telemetry import tracing_off

log = logging.getLogger(__name__)
tracer = trace.get_tracer("llmbus.bus")

PUBLISHED = Counter("llmbus_messages_published_total", "Messages published", ["service", "topic"])


def make_producer(settings: BusSettings, client_id: str) -> AIOKafkaProducer:
    # acks=all + idempotence: a retried send never duplicates or reorders within a partition, and
    # an acknowledged record is on min.insync.replicas brokers (the topics' setting).
    # A record over max_message_bytes fails at send (MessageSizeTooLargeError), before the broker:
    # the topics accept exactly what producers may send (llmbus.bus.admin.topic_config).
    return AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        client_id=client_id,
        acks="all",
        enable_idempotence=True,
        request_timeout_ms=settings.request_timeout_ms,
        linger_ms=settings.linger_ms,
        max_batch_size=min(settings.max_batch_bytes, settings.max_message_bytes),
        max_request_size=settings.max_message_bytes,
        **kafka_auth(settings),
    )


def _publish_span(topic: str) -> AbstractContextManager[trace.Span]:
    """A PRODUCER span per message; the consumer's span is its child.

    With tracing off, a message published inside a trace carries that trace's context as it
    is (no span of its own: nothing would record it); outside any trace a new, unsampled one
    is started, so every message still has a `traceparent` to be followed by.
    """
    current = trace.get_current_span()
    if tracing_off() and current.get_span_context().is_valid:
        return nullcontext(current)
    return tracer.start_as_current_span(f"{topic} publish", kind=trace.SpanKind.PRODUCER)


class PublishTimeout(RuntimeError):
    pass


class Publisher:
    """Publishes llmbus messages; each call returns once the broker acknowledged it."""

    def __init__(self, producer: AIOKafkaProducer, service: str, send_timeout_s: float) -> None:
        self._producer = producer
        self._service = service
        self._timeout_s = send_timeout_s

    async def publish(
        self,
        topic: str,
        value: Message,
        *,
        key: str | None,
        partition: int | None = None,
        request_id: str | None = None,
        tenant: str | None = None,
    ) -> None:
        with _publish_span(topic) as span:
            if span.is_recording():
                attributes = message_attributes(value)
                attributes |= {semconv.MESSAGING_SYSTEM: "kafka", semconv.MESSAGING_DESTINATION: topic}
                span.set_attributes(attributes)
            headers = hdr.outgoing(value, self._service, request_id=request_id, tenant=tenant)
            await self.publish_raw(topic, value.to_bytes(), key=key, headers=headers, partition=partition)
        observe_published(self._service, value)

    async def send(
        self, topic: str, value: Message, *, key: str | None, request_id: str | None = None, tenant: str | None = None
    ) -> asyncio.Future[object]:
        """Enqueue without waiting for the broker: returns the delivery future (await it, bounded).

        Records of one key keep their order (same partition, idempotent producer), so a stream
        of chunks can be sent this way and only the last one waited for.
        """
        headers = hdr.outgoing(value, self._service, request_id=request_id, tenant=tenant)
        encoded_key = key.encode() if key is not None else None
        delivery = await asyncio.wait_for(
            self._producer.send(topic, value.to_bytes(), key=encoded_key, headers=headers), self._timeout_s
        )
        PUBLISHED.labels(self._service, topic).inc()
        return delivery

    async def delivered(self, deliveries: list[asyncio.Future[object]]) -> None:
        """Wait (bounded) until every future from `send` is acknowledged; raises the first failure."""
        if deliveries:
            try:
                await asyncio.wait_for(asyncio.gather(*deliveries), self._timeout_s)
            except TimeoutError as exc:
                raise PublishTimeout(
                    f"no ack from Kafka for {len(deliveries)} records within {self._timeout_s}s"
                ) from exc

    async def publish_raw(
        self,
        topic: str,
        payload: bytes,
        *,
        key: str | None,
        headers: hdr.KafkaHeaders,
        partition: int | None = None,
    ) -> None:
        try:
            # One deadline for enqueue and ack (asyncio.timeout: no extra task per publish, unlike wait_for).
            async with asyncio.timeout(self._timeout_s):
                delivery = await self._producer.send(
                    topic, payload, key=key.encode() if key is not None else None, headers=headers, partition=partition
                )
                await delivery
        except TimeoutError as exc:
            raise PublishTimeout(f"no ack from Kafka for {topic} within {self._timeout_s}s") from exc
        PUBLISHED.labels(self._service, topic).inc()


async def stop_producer(producer: AIOKafkaProducer, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(producer.stop(), timeout_s)
    except TimeoutError:
        log.warning("producer did not stop within %.1fs", timeout_s)
