"""Producer factory with safe defaults, and a Publisher that bounds every send."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal, overload

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    ProducerClosed,
    UnknownProducerId,
)
from opentelemetry import trace
from prometheus_client import Counter

from llmbus.bus import headers as hdr
from llmbus.bus.message_metrics import observe_published
from llmbus.bus.partitioner import partition_for
from llmbus.bus.security import kafka_auth
from llmbus.bus.span_attrs import message_attributes
from llmbus.contract import semconv
from llmbus.contract.messages import Message
from llmbus.observability.metric_children import children_of
from llmbus.observability.telemetry import tracing_off
from llmbus.settings import BusSettings

log = logging.getLogger(__name__)
tracer = trace.get_tracer("llmbus.bus")

PUBLISHED = Counter("llmbus_messages_published_total", "Messages published", ["service", "topic"])
_published = children_of(PUBLISHED)
PRODUCER_RENEWALS = Counter(
    "llmbus_producer_renewals_total", "Producers replaced after the broker refused their sequence", ["service"]
)
# The broker refuses every later record of the partition: aiokafka (0.14) counts a batch that
# expired (no leader during a broker outage; keep_batches makes that rare) or was abandoned into
# its idempotence sequence, so the next ones arrive with a gap. Only a new producer (new producer
# id, sequences from 0) writes there again.
BROKEN_SEQUENCE = (OutOfOrderSequenceNumber, UnknownProducerId)
RETRY_PAUSE_S = 0.5


class PublishTimeout(RuntimeError):
    pass


class DeliveryAbandoned(RuntimeError):
    """The producer holding the record was replaced and stopped before it resolved the record's delivery."""


def worth_resending(exc: BaseException) -> bool:
    """The broker was away or slow, or refused the producer's sequence: the same record may go again.
    Not so a record refused for what it is (too large, not authorised): it would fail again."""
    resendable = (PublishTimeout, DeliveryAbandoned, TimeoutError, KafkaTimeoutError, ProducerClosed)
    if isinstance(exc, (*resendable, *BROKEN_SEQUENCE)):
        return True
    return isinstance(exc, KafkaError) and bool(exc.retriable)


def make_producer(settings: BusSettings, client_id: str) -> AIOKafkaProducer:
    # acks=all + idempotence: a retried send never duplicates or reorders within a partition, and
    # an acknowledged record is on min.insync.replicas brokers (the topics' setting).
    # A record over max_message_bytes fails at send (MessageSizeTooLargeError), before the broker:
    # the topics accept exactly what producers may send (llmbus.bus.admin.topic_config).
    # partition_for: the default partitioner's partitions, each key hashed once (llmbus.bus.partitioner).
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        client_id=client_id,
        acks="all",
        enable_idempotence=True,
        request_timeout_ms=settings.request_timeout_ms,
        metadata_max_age_ms=settings.metadata_max_age_ms,
        linger_ms=settings.linger_ms,
        max_batch_size=min(settings.max_batch_bytes, settings.max_message_bytes),
        max_request_size=settings.max_message_bytes,
        partitioner=partition_for,
        **kafka_auth(settings),
    )
    keep_batches(producer, settings.publish_retry_s)
    return producer


def keep_batches(producer: AIOKafkaProducer, hold_s: float) -> None:
    """Batches waiting for a partition leader are kept `hold_s` (the longest any caller retries), not
    request_timeout_ms.

    aiokafka (0.14) fails a batch whose partition has had no leader for request_timeout_ms, as it
    does while a broker shuts down and starts again, even a batch already sent once whose write
    may have happened with the answer lost. Its sender told it failed, a caller that must deliver
    sends the record again: two copies (a result written twice, the `broker_restart` scenario's
    "doubled"). Kept, the batch goes out again under the producer's own retries, with its
    idempotence sequence, and the broker drops a copy it already has. It also keeps the
    sequence free of the gap an expired batch left (BROKEN_SEQUENCE). What waits is bounded as
    before: one batch per partition, the send of a full one waits at most send_timeout_s.
    """
    accumulator = producer._message_accumulator  # no public setting for it (aiokafka 0.14)
    if not hasattr(accumulator, "_batch_ttl"):
        raise RuntimeError("aiokafka's batch expiry moved: llmbus.bus.producer.keep_batches needs updating")
    accumulator._batch_ttl = hold_s


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


ProducerFactory = Callable[[], Awaitable[AIOKafkaProducer]]
Delivery = asyncio.Future[object]  # a record's delivery: resolved when the broker acknowledged it


class Publisher:
    """Publishes llmbus messages: the one way onto the bus (headers, trace context, retries, metrics).

    `publish` puts one record (or a tombstone) and by default returns once the broker acknowledged it;
    `publish(..., wait=False)` returns its delivery instead, for `delivered`; `publish_many` puts many
    records at once, batched per partition.

    With `renew` (a factory of started producers), a producer whose idempotence sequence the
    broker refuses is replaced by a new one, so a broker outage cannot leave a partition
    unwritable for the rest of the process's life.
    """

    def __init__(
        self, producer: AIOKafkaProducer, service: str, send_timeout_s: float, renew: ProducerFactory | None = None
    ) -> None:
        self._producer = producer
        self._service = service
        self._timeout_s = send_timeout_s
        self._renew = renew
        self._renewing = asyncio.Lock()
        self._retired: set[asyncio.Task[None]] = set()
        self._stopping: dict[AIOKafkaProducer, asyncio.Task[None]] = {}  # replaced producer → its stop
        # A pending `send`'s producer, so `delivered` knows a record that producer will never resolve.
        self._sent_by: weakref.WeakKeyDictionary[asyncio.Future[object], tuple[AIOKafkaProducer, str]] = (
            weakref.WeakKeyDictionary()
        )
        # Every topic written (full names): a service's tests compare them with its declared contract.
        self.topics_written: set[str] = set()

    def _acknowledged(self, topic: str, records: int = 1) -> None:
        _published(self._service, topic).inc(records)
        self.topics_written.add(topic)

    @property
    def producer(self) -> AIOKafkaProducer:
        return self._producer

    async def close(self, timeout_s: float) -> None:
        await stop_producer(self._producer, timeout_s)

    async def _replace_broken(self, broken: AIOKafkaProducer, exc: BaseException) -> None:
        """A new producer in place of `broken` (once, however many sends saw it fail)."""
        if self._renew is None or not isinstance(exc, BROKEN_SEQUENCE):
            return
        async with self._renewing:
            if self._producer is not broken:
                return  # another send replaced it already
            log.warning("producer's sequence refused by the broker (%r): starting a new producer", exc)
            try:
                self._producer = await self._renew()
            except Exception:  # the broker is away again: the next refused send tries once more
                log.warning("could not start a new producer; keeping the old one for now", exc_info=True)
                return
            PRODUCER_RENEWALS.labels(self._service).inc()
            log.warning("new producer started; the old one is stopped in the background")
        # What the old one still holds is sent or fails by itself; its callers resend what failed,
        # and what it never resolved (stopped before) is sent again by whoever waits for it.
        task = asyncio.create_task(stop_producer(broken, self._timeout_s))
        self._stopping[broken] = task
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    def _abandoned(self, producer: AIOKafkaProducer) -> bool:
        """`producer` was replaced and has stopped: a delivery it left pending will never resolve."""
        stopping = self._stopping.get(producer)
        return producer is not self._producer and stopping is not None and stopping.done()

    @overload
    async def publish(
        self,
        topic: str,
        value: Message | None,
        *,
        key: str | None,
        partition: int | None = None,
        request_id: str | None = None,
        tenant: str | None = None,
        payload: bytes | None = None,
        retry_for_s: float = 0.0,
        wait: Literal[True] = True,
    ) -> None: ...

    @overload
    async def publish(
        self,
        topic: str,
        value: Message | None,
        *,
        key: str | None,
        partition: int | None = None,
        request_id: str | None = None,
        tenant: str | None = None,
        payload: bytes | None = None,
        retry_for_s: float = 0.0,
        wait: Literal[False],
    ) -> Delivery: ...

    async def publish(
        self,
        topic: str,
        value: Message | None,
        *,
        key: str | None,
        partition: int | None = None,
        request_id: str | None = None,
        tenant: str | None = None,
        payload: bytes | None = None,
        retry_for_s: float = 0.0,
        wait: bool = True,
    ) -> Delivery | None:
        """Publish `value` (None: a tombstone of `key`); returns once the broker acknowledged it, with
        `retry_for_s` once it did within that time however often the broker was away.

        `wait` False: the record is enqueued and its delivery returned (await it, or many, with
        `delivered`): records of one key keep their order (same partition, idempotent producer), so
        a stream of chunks is sent this way and only the last one waited for. `payload`: `value`
        already encoded (bytes that must be published exactly as staged elsewhere).

        Retrying never writes a second, different record: a send whose ack is late is waited for
        (the record is still in the producer and will be written), and only a send that failed is
        sent again, with the same bytes (readers drop such a copy by its key fields).
        """
        if not wait:
            return await self._enqueue_one(topic, value, key, partition, request_id, tenant, payload, retry_for_s)
        with _publish_span(topic) as span:
            if value is not None and span.is_recording():
                attributes = message_attributes(value)
                attributes |= {semconv.MESSAGING_SYSTEM: "kafka", semconv.MESSAGING_DESTINATION: topic}
                span.set_attributes(attributes)
            headers = hdr.outgoing(value, self._service, request_id=request_id, tenant=tenant)
            data = payload if payload is not None else None if value is None else value.to_bytes()
            if retry_for_s > 0:
                await self._publish_until_acked(topic, data, key, headers, partition, retry_for_s)
            else:
                await self._publish_bytes(topic, data, key=key, headers=headers, partition=partition)
        if value is not None:
            observe_published(self._service, value)
        return None

    async def _publish_until_acked(
        self,
        topic: str,
        payload: bytes | None,
        key: str | None,
        headers: hdr.KafkaHeaders,
        partition: int | None,
        retry_for_s: float,
    ) -> None:
        deadline_s = time.monotonic() + retry_for_s
        encoded_key = key.encode() if key is not None else None
        while True:
            producer, delivery = await self._enqueue(topic, payload, encoded_key, headers, partition, deadline_s)
            try:
                await self._wait_ack(topic, producer, delivery, deadline_s)
                self._acknowledged(topic)
                return
            except (KafkaError, DeliveryAbandoned) as exc:
                # Failed for good, or its producer is gone: nothing was written, send again.
                await self._pause_before_resending(topic, producer, exc, deadline_s)

    async def _enqueue(
        self,
        topic: str,
        payload: bytes | None,
        key: bytes | None,
        headers: hdr.KafkaHeaders,
        partition: int | None,
        deadline_s: float,
    ) -> tuple[AIOKafkaProducer, asyncio.Future[object]]:
        """The record handed to the current producer, retried until `deadline_s` while it is refused.

        A partition waiting for its leader holds one batch (kept, keep_batches); once that is full,
        aiokafka lets nothing more in and fails the enqueue after request_timeout_ms. Nothing was
        queued then, so trying again writes no copy. Returns the producer with the delivery future.
        """
        while True:
            producer = self._producer
            try:
                async with asyncio.timeout(self._timeout_s):  # not wait_for: no task per record
                    delivery = await producer.send(topic, payload, key=key, headers=headers, partition=partition)
                return producer, delivery
            except (KafkaError, TimeoutError) as exc:
                await self._pause_before_resending(topic, producer, exc, deadline_s)

    async def _pause_before_resending(
        self, topic: str, producer: AIOKafkaProducer, exc: BaseException, deadline_s: float
    ) -> None:
        """Raise `exc` if sending again cannot help, PublishTimeout if no time is left; else pause."""
        if not worth_resending(exc):
            raise exc
        await self._replace_broken(producer, exc)
        if time.monotonic() + RETRY_PAUSE_S >= deadline_s:
            raise PublishTimeout(f"{topic}: {type(exc).__name__} until the retry time ran out") from exc
        log.warning("publish to %s failed (%r); sending it again", topic, exc)
        await asyncio.sleep(RETRY_PAUSE_S)

    async def _wait_ack(
        self, topic: str, producer: AIOKafkaProducer, delivery: asyncio.Future[object], deadline_s: float
    ) -> None:
        """Until `delivery` resolves (its result raised) or `deadline_s`; DeliveryAbandoned if its
        producer was replaced and stopped first. Never cancelled: a late ack still comes (the batch is
        kept through a leader change), and resending meanwhile could write the record twice."""
        while not delivery.done():
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                raise PublishTimeout(f"no ack from Kafka for {topic} in the retry time")
            done, _ = await asyncio.wait({delivery}, timeout=min(self._timeout_s, left_s))
            if not done:
                if self._abandoned(producer):
                    raise DeliveryAbandoned(f"{topic}: its producer was replaced and stopped")
                log.warning("no ack yet from Kafka for %s; still waiting (the record is queued)", topic)
        delivery.result()

    async def _enqueue_one(
        self,
        topic: str,
        value: Message | None,
        key: str | None,
        partition: int | None,
        request_id: str | None,
        tenant: str | None,
        payload: bytes | None,
        retry_for_s: float,
    ) -> Delivery:
        """`publish(wait=False)`: enqueued, not waited for. With `retry_for_s`, an enqueue refused while
        a partition waits for its leader is tried again until that time is spent (`publish`'s rule:
        nothing was queued, so no copy is written)."""
        headers = hdr.outgoing(value, self._service, request_id=request_id, tenant=tenant)
        encoded_key = key.encode() if key is not None else None
        data = payload if payload is not None else None if value is None else value.to_bytes()
        if retry_for_s > 0:
            deadline_s = time.monotonic() + retry_for_s
            producer, delivery = await self._enqueue(topic, data, encoded_key, headers, partition, deadline_s)
        else:
            producer = self._producer
            async with asyncio.timeout(self._timeout_s):  # not wait_for: no task per chunk
                delivery = await producer.send(topic, data, key=encoded_key, headers=headers, partition=partition)
        self._sent_by[delivery] = (producer, topic)
        delivery.add_done_callback(lambda done: self._check_delivery(producer, done))
        self._acknowledged(topic)
        return delivery

    async def publish_many(self, topic: str, items: Sequence[tuple[Message, bytes | None, str | None]]) -> None:
        """Many records (message, its bytes or None, key) as one record batch per partition; returns once
        the broker acknowledged them all.

        For thousands of records at once (cost-accounting's CostRecords): a `publish` per record costs a
        partitioner step, an accumulator step and a future each. Each record keeps its own key (its
        partition, as `publish` would pick it), request id and tenant; the trace context is taken once.
        """
        await self.delivered(await self._enqueue_batches(topic, items))

    async def _enqueue_batches(
        self, topic: str, items: Sequence[tuple[Message, bytes | None, str | None]]
    ) -> list[Delivery]:
        if not items:
            return []
        producer = self._producer
        trace_headers = hdr.trace_headers_now()
        sent: list[asyncio.Future[object]] = []
        try:
            async with asyncio.timeout(self._timeout_s):
                partitions = sorted(await producer.partitions_for(topic))
                batches: dict[int, Any] = {}
                for value, payload, key in items:
                    key_bytes = key.encode() if key is not None else None
                    partition = partition_for(key_bytes, partitions, partitions)  # the producer's own choice
                    data = value.to_bytes() if payload is None else payload
                    fields: dict[str, Any] = {"key": key_bytes, "value": data, "timestamp": None}
                    fields["headers"] = hdr.outgoing(value, self._service, trace=trace_headers)
                    batch = batches.get(partition)
                    if batch is not None and batch.append(**fields) is not None:
                        continue
                    if batch is not None:  # full: it goes now, the record starts the next one
                        sent.append(await producer.send_batch(batch, topic, partition=partition))
                    batch = batches[partition] = producer.create_batch()
                    if batch.append(**fields) is None:
                        raise MessageSizeTooLargeError(f"a record of {len(data)} bytes for {topic}")
                for partition, batch in batches.items():  # each holds at least one record
                    sent.append(await producer.send_batch(batch, topic, partition=partition))
        except TimeoutError as exc:
            raise PublishTimeout(f"Kafka did not take {len(items)} records for {topic} in time") from exc
        for delivery in sent:
            delivery.add_done_callback(lambda done: self._check_delivery(producer, done))
        self._acknowledged(topic, len(items))
        return sent

    def _check_delivery(self, producer: AIOKafkaProducer, delivery: asyncio.Future[object]) -> None:
        """A send whose ack is awaited elsewhere may still show that its producer needs replacing."""
        if delivery.cancelled() or not isinstance(exc := delivery.exception(), BROKEN_SEQUENCE):
            return
        task = asyncio.create_task(self._replace_broken(producer, exc))
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    async def delivered(self, deliveries: list[asyncio.Future[object]], retry_for_s: float = 0.0) -> None:
        """Wait until every future from `send` is acknowledged; raises the first failure.

        Bounded by send_timeout_s, or with `retry_for_s` by that: an ack that is late because a
        partition waits for its new leader is waited for, as `publish` does (the batch is kept and
        goes out under the producer's own retries), not given up on for a resend that would write
        the records twice. DeliveryAbandoned if a record's producer was replaced and stopped first.
        """
        if deliveries and all(delivery.done() for delivery in deliveries):
            for delivery in deliveries:  # resolved already, as often by now: no gather, no wait
                delivery.result()
            return
        if retry_for_s > 0:
            deadline_s = time.monotonic() + retry_for_s
            for delivery in deliveries:
                producer, topic = self._sent_by.get(delivery, (self._producer, "a topic"))
                await self._wait_ack(topic, producer, delivery, deadline_s)
            return
        if deliveries:
            try:
                async with asyncio.timeout(self._timeout_s):
                    await asyncio.gather(*deliveries)
            except TimeoutError as exc:
                raise PublishTimeout(
                    f"no ack from Kafka for {len(deliveries)} records within {self._timeout_s}s"
                ) from exc

    async def _publish_bytes(
        self,
        topic: str,
        payload: bytes | None,
        *,
        key: str | None,
        headers: hdr.KafkaHeaders,
        partition: int | None = None,
    ) -> None:
        producer = self._producer
        try:
            # One deadline for enqueue and ack (asyncio.timeout: no extra task per publish, unlike wait_for).
            async with asyncio.timeout(self._timeout_s):
                delivery = await producer.send(
                    topic, payload, key=key.encode() if key is not None else None, headers=headers, partition=partition
                )
                await delivery
        except TimeoutError as exc:
            raise PublishTimeout(f"no ack from Kafka for {topic} within {self._timeout_s}s") from exc
        except KafkaError as exc:
            await self._replace_broken(producer, exc)  # the caller's retry then goes out on a working one
            raise
        self._acknowledged(topic)


async def stop_producer(producer: AIOKafkaProducer, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(producer.stop(), timeout_s)
    except TimeoutError:
        log.warning("producer did not stop within %.1fs", timeout_s)
