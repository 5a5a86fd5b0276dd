"""Cost-accounting wiring: a FastStream Kafka broker with typed subscribers, Redis, the ledger ticker.

Why FastStream (and not the project's ConsumerLoop): this service is consume -> compute ->
produce with no per-record concurrency to order, which is what FastStream's subscribers do;
batches of llm.results are committed after the handler (AckPolicy.NACK_ON_ERROR: an
infrastructure failure seeks back and the batch comes again; a bad record goes to llm.dlq from
inside the handler, so one bad record never blocks a partition). The batch handler takes the
raw records (not `list[InferenceResult]`) only so a record that does not decode can be
dead-lettered with its partition and offset instead of failing the whole batch.

One part bypasses FastStream: the CostRecords go to llm.costs through `costs_publisher.py`
(one record batch per partition; it says why). In memory (TestKafkaBroker, `start()` not
called) they go through the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka.structs import ConsumerRecord
from faststream import AckPolicy, FastStream
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from faststream.message import StreamMessage
from faststream.specification import AsyncAPI
from pydantic import ValidationError

from llmbus import topics as t
from llmbus.bus import headers as hdr
from llmbus.bus.codec import BadMessage
from llmbus.bus.dlq import DEAD_LETTERS, dead_letter
from llmbus.bus.producer import PublishTimeout
from llmbus.bus.security import faststream_security
from llmbus.bus.tables import read_table
from llmbus.contract.tolerant import tolerant_decoder
from llmbus.messages import ErrorCode, Message, PriceBookUpdate, ScaleDecision, WorkerStatus, now_ms
from llmbus.settings import BusSettings
from llmbus.state import redis_client
from services.cost_accounting.config import CostSettings
from services.cost_accounting.core.budgets import load_budgets
from services.cost_accounting.core.gpu_ledger import GpuLedger
from services.cost_accounting.core.prices import load_pricebook
from services.cost_accounting.costs_publisher import CostsPublisher, Items
from services.cost_accounting.handlers import CostHandlers
from services.cost_accounting.store import CostStore

log = logging.getLogger(__name__)


class CostService:
    def __init__(self, settings: BusSettings, cost: CostSettings, broker: KafkaBroker | None = None) -> None:
        self.settings = settings
        self.cost = cost
        self.topics = t.Topics(settings.topic_prefix)
        self.broker = broker or KafkaBroker(
            settings.kafka_bootstrap,
            client_id=f"llmbus-{t.COST}",
            security=faststream_security(settings),
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=settings.request_timeout_ms,
            max_batch_size=min(settings.max_batch_bytes, settings.max_message_bytes),
            # FastStream logs every batch it receives and processes: at DEBUG, not INFO (a replay is
            # thousands of batches, and formatting their log lines cost more than costing them).
            log_level=logging.DEBUG,
        )
        self.app = FastStream(self.broker, specification=AsyncAPI(title="llmbus cost-accounting"))
        book = load_pricebook(cost.pricebook_path)
        self.ledger = GpuLedger(
            book,
            interval_ms=cost.interval_s * 1000,
            grace_ms=int(cost.grace_s * 1000),
            cold_start_requests=cost.cold_start_requests,
            prefill_token_weight=cost.prefill_token_weight,
            decode_token_weight=cost.decode_token_weight,
        )
        self.redis = redis_client(settings.redis_url, password=settings.redis_password)
        self.store = CostStore(self.redis, settings.topic_prefix, cost.dedupe_ttl_s)
        self.handlers = CostHandlers(
            book,
            self.ledger,
            load_budgets(cost.budgets_path),
            self.store,
            self.topics,
            self.publish_all,
            self.publish_records,
            self.dlq,
            batch_full_records=min(cost.backlog_batch_records, cost.batch_max_records),
            settle_s=cost.settle_s,
        )
        self._ticker: asyncio.Task[None] | None = None
        self.costs_publisher: CostsPublisher | None = None  # set by start()
        self._subscribe()

    def asyncapi(self) -> dict[str, Any]:
        """The AsyncAPI document FastStream derives from the real handlers."""
        spec = self.app.schema.to_specification()
        return dict(spec.to_jsonable())

    def _subscribe(self) -> None:
        handlers, topics = self.handlers, self.topics
        batch: dict[str, Any] = {
            "batch": True,
            "max_records": self.cost.batch_max_records,
            "auto_offset_reset": "earliest",
            "ack_policy": AckPolicy.NACK_ON_ERROR,
            "parser": _batch_parser,
            "decoder": _batch_values,
        }

        # No group: every replica reads the whole compacted heartbeat table.
        @self.broker.subscriber(
            topics.name(t.WORKERS), auto_offset_reset="earliest", decoder=tolerant_decoder(WorkerStatus)
        )
        async def on_worker(status: WorkerStatus) -> None:
            handlers.on_worker(status)

        @self.broker.subscriber(topics.name(t.PRICEBOOK), auto_offset_reset="earliest")
        async def on_pricebook(update: PriceBookUpdate, message: KafkaMessage) -> None:
            try:
                handlers.on_pricebook(update)
            except ValidationError as exc:  # the current book stays; the bad one is on record
                await self.dlq(message.raw_message, BadMessage(ErrorCode.INVALID_REQUEST, f"price book: {exc}"))

        # The autoscaler's decisions: scale events per pool, beside the cold starts they cost.
        @self.broker.subscriber(
            topics.name(t.SCALING),
            group_id=topics.group(t.COST, "scaling"),
            auto_offset_reset="earliest",
            decoder=tolerant_decoder(ScaleDecision),
        )
        async def on_scaling(decision: ScaleDecision) -> None:
            await handlers.on_scaling(decision)

        @self.broker.subscriber(topics.name(t.RESULTS), group_id=topics.group(t.COST, "results"), **batch)
        async def on_results(_: list[bytes], message: KafkaMessage) -> None:
            await handlers.on_results(message.raw_message)  # type: ignore[arg-type]

    async def publish_records(self, items: Items) -> None:
        """CostRecords already encoded, onto llm.costs (costs_publisher.py says why not through FastStream)."""
        if self.costs_publisher is not None:
            await self.costs_publisher.publish(items)
        else:  # in memory (TestKafkaBroker, start() not called): through the broker
            await self._publish_encoded(self.topics.name(t.COSTS), items)

    async def _publish_encoded(self, topic: str, items: Items) -> None:
        async with asyncio.timeout(self.settings.send_timeout_s):
            for message, payload, key in items:
                headers = dict(hdr.as_dict(hdr.outgoing(message, t.COST)))
                await self.broker.publish(
                    payload, topic, key=key.encode() if key is not None else None, headers=headers
                )

    async def publish_all(self, topic: str, items: Sequence[tuple[Message, str | None]]) -> None:
        """Send all, then wait (bounded) for every broker ack: a batch costs one round trip, not one per record."""
        deliveries = []
        try:
            # One deadline for enqueueing the whole batch (wait_for per record made a task per record).
            async with asyncio.timeout(self.settings.send_timeout_s):
                for message, key in items:
                    headers = dict(hdr.as_dict(hdr.outgoing(message, t.COST)))
                    deliveries.append(
                        await self.broker.publish(
                            message.to_bytes(),
                            topic,
                            key=key.encode() if key is not None else None,
                            headers=headers,
                            no_confirm=True,
                        )
                    )
        except TimeoutError as exc:
            raise PublishTimeout(f"Kafka did not take {len(items)} records for {topic} in time") from exc
        pending = [d for d in deliveries if isinstance(d, asyncio.Future)]  # TestKafkaBroker returns none
        try:
            await asyncio.wait_for(asyncio.gather(*pending), self.settings.send_timeout_s)
        except TimeoutError as exc:
            raise PublishTimeout(f"no ack from Kafka for {len(deliveries)} records on {topic}") from exc

    async def dlq(self, record: Any, exc: Exception) -> None:
        code = exc.code if isinstance(exc, BadMessage) else ErrorCode.INTERNAL
        reason = exc.reason if isinstance(exc, BadMessage) else f"{type(exc).__name__}: {exc}"
        letter = dead_letter(record, code, reason, t.COST, getattr(exc, "request_id", None))
        key = record.key.decode(errors="replace") if record.key is not None else None
        await self.publish_all(self.topics.name(t.DLQ), [(letter, key)])
        DEAD_LETTERS.labels(t.COST, code).inc()

    async def start(self) -> None:
        # The heartbeat table first, then the held results: the ledger knows every worker's life
        # before the first result arrives.
        table = await read_table(self.settings, self.topics.name(t.WORKERS), WorkerStatus)
        for status in sorted(table.values(), key=lambda s: s.sent_at_ms):
            self.handlers.on_worker(status)
        for update in (await read_table(self.settings, self.topics.name(t.PRICEBOOK), PriceBookUpdate)).values():
            try:
                self.handlers.on_pricebook(update)
            except ValidationError:
                log.exception("the price book on %s is invalid; keeping the file's", t.PRICEBOOK)
        self.costs_publisher = CostsPublisher(self.settings, self.topics.name(t.COSTS))
        await self.costs_publisher.start()
        # Restoring may publish (the outbox's records, a budget alert): the broker's producer is
        # connected first, its subscribers start only once the ledger is back.
        await self.broker.connect()
        await self.handlers.restore()
        await self.broker.start()
        self._ticker = asyncio.create_task(self._tick_forever(), name="cost-ledger-ticker")
        if self.cost.gc_freeze:
            # What start-up built (modules, schemas, the broker, the ledger) lives as long as the
            # process: out of the collector's full passes, which on a backlog otherwise walked it
            # again every few thousand results (a third of the CPU of decoding them).
            gc.collect()
            gc.freeze()
        if self.cost.gc_gen0_threshold:
            # A batch allocates tens of thousands of short-lived objects (none in cycles): collecting
            # the young generation every 700 allocations walked each batch's live objects over and over.
            _, gen1, gen2 = gc.get_threshold()
            gc.set_threshold(self.cost.gc_gen0_threshold, gen1, gen2)

    async def _tick_forever(self) -> None:
        while True:
            try:
                await self.handlers.tick(now_ms(), int(self.cost.worker_expiry_s * 1000))
            except Exception:  # Redis or Kafka away: the same intervals close on the next tick
                log.exception("closing ledger intervals failed; retrying")
            await asyncio.sleep(self.cost.close_every_s)

    async def stop(self) -> None:
        if self._ticker:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        await asyncio.wait_for(self.broker.stop(), self.settings.stop_timeout_s)
        if self.costs_publisher is not None:
            await self.costs_publisher.stop()
        await self.redis.aclose()


async def _batch_parser(
    records: tuple[ConsumerRecord, ...], parse: Callable[[tuple[ConsumerRecord, ...]], Awaitable[StreamMessage[Any]]]
) -> StreamMessage[Any]:
    """FastStream's batch parser turns every record's headers into a dict, which nothing here reads
    (a tenth of the service's CPU on a backlog): the batch's message is parsed from its first record,
    then carries all of them (`raw_message`: what the handlers read, and what a nack rewinds to)."""
    message = await parse(records[:1])
    message.raw_message = records
    message.body = [record.value or b"" for record in records]
    return message


async def _batch_values(message: StreamMessage[Any]) -> list[bytes]:
    """The batch's record values as they came. FastStream's own batch decoder parses every record into
    a message object and JSON-decodes it, which the handlers (they decode the raw records themselves,
    with their offsets for the DLQ) never read: on a backlog that was a third of the service's CPU."""
    return list(message.body)


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    service = CostService(settings, CostSettings())
    await service.start()
    log.info("cost-accounting running (results -> llm.costs + aggregates, budgets)")
    await stop.wait()
    await service.stop()
