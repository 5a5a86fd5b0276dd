"""Consumer factory and the loop every service runs: bounded concurrency, ordered commits.

Offsets are committed only after a record's work and outputs are done (at-least-once);
records of one partition may finish out of order, the commit point never passes an
unfinished one. A record whose handler raises goes to `on_error` (the DLQ); if that fails
too it is logged, counted and skipped: a restart would only meet the same record again.

Backpressure never drops a record: at `max_in_flight` every assigned partition is paused,
again after each rebalance (aiokafka hands out new partitions unpaused), and a record that
is fetched all the same is rewound to, so it is read again once a slot is free.
Commit failures are retried or left for later (llmbus.bus.commits); only fatal ones stop the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from contextvars import Token
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata
from opentelemetry import context as otel_context
from opentelemetry import trace
from prometheus_client import Counter, Gauge, Histogram

from llmbus.bus.commits import commit_with_retry
from llmbus.bus.headers import REQUEST_ID, UPGRADE_ID, header_value, trace_context
from llmbus.bus.holds import Holds
from llmbus.bus.offsets import OffsetTracker
from llmbus.bus.security import kafka_auth
from llmbus.contract import semconv
from llmbus.observability.metric_children import children_of
from llmbus.observability.telemetry import request_id_var, tracing_off
from llmbus.settings import BusSettings

log = logging.getLogger(__name__)
tracer = trace.get_tracer("llmbus.bus")

Handler = Callable[[ConsumerRecord], Awaitable[None]]
BatchHandler = Callable[[list[ConsumerRecord]], Awaitable[None]]
ErrorHandler = Callable[[ConsumerRecord, Exception], Awaitable[None]]
RevokeHook = Callable[[set[TopicPartition]], object]

CONSUMED = Counter("llmbus_messages_consumed_total", "Records handled", ["service", "topic", "outcome"])
REWOUND = Counter(
    "llmbus_records_rewound_total", "Records fetched while saturated, read again later", ["service", "topic"]
)
LAG = Gauge(
    "llmbus_consumer_lag_records",
    "Records behind the partition's end after the last fetch (broker lag)",
    ["service", "topic", "partition"],
)
HANDLE_SECONDS = Histogram(
    "llmbus_handler_seconds",
    "Time from a record's start to its handler's end",
    ["service", "topic"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
_consumed = children_of(CONSUMED)
_handle_seconds = children_of(HANDLE_SECONDS)
_lag = children_of(LAG)


def make_consumer(
    settings: BusSettings,
    *topics: str,
    group_id: str | None,
    client_id: str,
    from_beginning: bool = True,
    **overrides: object,
) -> AIOKafkaConsumer:
    options: dict[str, object] = {
        "bootstrap_servers": settings.kafka_bootstrap,
        "client_id": client_id,
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest" if from_beginning else "latest",
        "max_poll_records": settings.max_poll_records,
        "session_timeout_ms": settings.session_timeout_ms,
        "heartbeat_interval_ms": settings.heartbeat_interval_ms,
        "request_timeout_ms": max(settings.request_timeout_ms, settings.session_timeout_ms + 5000),
        "isolation_level": "read_committed",
        "metadata_max_age_ms": settings.metadata_max_age_ms,
    }
    options.update(kafka_auth(settings))
    options.update(overrides)
    return AIOKafkaConsumer(*topics, **options)  # type: ignore[arg-type]


class ConsumerStalled(RuntimeError):
    """The poll loop stopped coming round: the service should exit and be restarted."""


class StopService(RuntimeError):
    """Raised by a handler whose failure no retry fixes and no record caused (the service's credentials
    or rights, llmbus.state.errors' FATAL): the loop stops with it, the record uncommitted, instead of
    dead-lettering every record that meets it."""


class ConsumerLoop:
    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        handler: Handler,
        on_error: ErrorHandler,
        settings: BusSettings,
        *,
        service: str,
        max_in_flight: int = 1,
        commit_offsets: bool = True,
        drain_grace_s: float | None = None,
        batch_handler: BatchHandler | None = None,
        batch_max_records: int = 500,
        holds: Holds[Any] | None = None,
        on_revoke: RevokeHook | None = None,
        grace_over: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`on_revoke`: told of partitions taken away before they are committed (what the service
        still holds for them it hands over: its handlers, cancelled, leave their records uncommitted).
        `grace_over`: called when a drain's grace is over with records still in flight (the handler
        gives them back); they then get `stop_timeout_s` more before they are cancelled."""
        self._consumer = consumer
        self._handler = handler
        # A batch handler takes every record of one fetch at once (one batch in flight per slot);
        # a batch that raises goes to `on_error` record by record, like single records.
        self._batch_handler = batch_handler
        self._batch_max_records = batch_max_records
        self._on_error = on_error
        self._settings = settings
        self._service = service
        self._max_in_flight = max_in_flight
        self._commit_offsets = commit_offsets  # False for group-less readers of compacted state
        self._drain_grace_s = settings.stop_timeout_s if drain_grace_s is None else drain_grace_s
        self._on_revoke = on_revoke
        self._grace_over = grace_over
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()
        self._saturated = False
        # Bumped when a partition is revoked: a record started before does not count as done after.
        self._epochs: dict[TopicPartition, int] = {}
        # One commit at a time (the periodic one runs beside polling, a revoke's waits its turn), so
        # a commit's offsets are always read after the revoke before it has forgotten its partitions.
        self._commit_lock = asyncio.Lock()
        self._committing: asyncio.Task[None] | None = None
        self.last_poll_monotonic = time.monotonic()
        self._fatal: asyncio.Future[None] | None = None  # set by a StopService, in `run`
        # Records the handler holds open after it returned (llmbus.bus.holds): done on release.
        self._holds = holds
        self._held_epochs: dict[tuple[TopicPartition, int], int] = {}
        if holds is not None:
            holds.bind(self._released)

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def rebalance_listener(self) -> ConsumerRebalanceListener:
        loop = self

        class _Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
                if loop._on_revoke is not None:
                    loop._on_revoke(set(revoked))
                    await asyncio.sleep(0)  # the handlers it cancelled end (uncommitted) before the commit
                await loop.commit()
                loop._forget(list(revoked))

            async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
                if loop._saturated:  # before anything awaits: the fetcher must not start on them
                    loop._consumer.pause(*assigned)
                log.info("assigned %s", sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned))

        return _Listener()

    async def run(self, stop: asyncio.Event) -> None:
        """Poll, hand records to the handler, commit; returns after `stop` and a final commit.

        A watchdog ends the loop with ConsumerStalled when polling has not come round for
        `watchdog_s`: the process exits and restarts from its commits instead of hanging.
        """
        self.last_poll_monotonic = time.monotonic()
        self._fatal = asyncio.get_running_loop().create_future()
        poll = asyncio.create_task(self._poll_until(stop))
        watchdog = asyncio.create_task(self._watchdog())
        try:
            await asyncio.wait({poll, watchdog, self._fatal}, return_when=asyncio.FIRST_COMPLETED)
            if not poll.done():
                poll.cancel()
                await asyncio.gather(poll, return_exceptions=True)
                if self._fatal.done():
                    self._fatal.result()  # the handler's StopService
                raise ConsumerStalled(f"no poll for {self._settings.watchdog_s:.0f}s")
            poll.result()
        finally:
            watchdog.cancel()
            if not self._fatal.done():
                self._fatal.cancel()
            await self.drain(self._drain_grace_s)

    async def _watchdog(self) -> None:
        while time.monotonic() - self.last_poll_monotonic <= self._settings.watchdog_s:
            await asyncio.sleep(max(self._settings.watchdog_s / 4, 0.05))
        log.critical("consumer loop stalled: no poll for %.0fs", self._settings.watchdog_s)

    def _forget(self, revoked: list[TopicPartition]) -> None:
        for tp in revoked:
            self._epochs[tp] = self._epochs.get(tp, 0) + 1
        self._tracker.forget(revoked)
        if self._holds is not None:
            self._holds.forget(revoked)
            self._held_epochs = {k: e for k, e in self._held_epochs.items() if k[0] not in revoked}

    def _finished(self, tp: TopicPartition, offset: int, epoch: int, handled: bool) -> None:
        """The handler returned: done, unless it holds the record open (then done on release). A
        record dead-lettered instead is done whatever a failed attempt held."""
        if self._holds is not None and self._holds.is_held(tp, offset):
            if handled:
                self._held_epochs[(tp, offset)] = epoch
                return
            self._holds.discard(tp, offset)
        self._tracker.done(tp, offset)

    def _released(self, tp: TopicPartition, offset: int) -> None:
        epoch = self._held_epochs.pop((tp, offset), None)
        if epoch is not None and self._epochs.get(tp, 0) == epoch:
            self._tracker.done(tp, offset)

    def _rewind(self, batches: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """Records fetched while saturated are not started, and not dropped: read them again later."""
        for tp, records in batches.items():
            if records:
                self._consumer.seek(tp, records[0].offset)
                REWOUND.labels(self._service, tp.topic).inc(len(records))
                log.debug("saturated: rewound %s[%d] to %d", tp.topic, tp.partition, records[0].offset)

    async def _poll_until(self, stop: asyncio.Event) -> None:
        next_commit = time.monotonic() + self._settings.commit_interval_s
        while not stop.is_set():
            self.last_poll_monotonic = time.monotonic()
            free = self._max_in_flight - len(self._tasks)
            if free <= 0:
                # Paused on every pass, not once: a rebalance since the last one may have brought new partitions.
                self._saturated = True
                self._consumer.pause(*self._consumer.assignment())
                # Keep polling (it keeps the group membership alive) but wait for a free slot.
                self._slot_freed.clear()
                try:
                    await asyncio.wait_for(self._slot_freed.wait(), self._settings.poll_timeout_ms / 1000)
                except TimeoutError:
                    pass
                self._rewind(await self._consumer.getmany(timeout_ms=0))
            else:
                if self._saturated:
                    self._consumer.resume(*self._consumer.paused())
                    self._saturated = False
                wanted = self._batch_max_records if self._batch_handler else min(free, self._settings.max_poll_records)
                batches = await self._consumer.getmany(timeout_ms=self._settings.poll_timeout_ms, max_records=wanted)
                if self._batch_handler is not None:
                    self._start_batch(batches)
                for tp, records in batches.items():
                    if self._batch_handler is None:
                        for record in records:
                            self._start(tp, record)
                    if records and (high := self._consumer.highwater(tp)) is not None:
                        _lag(self._service, tp.topic, str(tp.partition)).set(max(0, high - records[-1].offset - 1))
            if time.monotonic() >= next_commit:
                self._commit_beside_polling()
                next_commit = time.monotonic() + self._settings.commit_interval_s

    def _commit_beside_polling(self) -> None:
        """Start the periodic commit without waiting for it (none while the last one still runs).

        A commit waits for the group's coordinator: while the broker leading its __consumer_offsets
        partition is lost, aiokafka (0.14) looks for the new one until it is elected, and the
        commit is retried for commit_timeout_s. Awaited in the poll loop, that stopped fetching and
        handling for every such wait (the scheduler's outcomes unread for 20 s after a broker
        SIGKILL: placements never released, queues full, requests past their deadline).
        """
        task = self._committing
        if task is not None:
            if not task.done():
                return
            task.result()  # an error retrying cannot fix stops the loop, as an awaited commit did
        self._committing = asyncio.create_task(self.commit())

    def _start(self, tp: TopicPartition, record: ConsumerRecord) -> None:
        self._tracker.started(tp, record.offset)
        task = asyncio.create_task(self._handle(tp, record, self._epochs.get(tp, 0)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start_batch(self, batches: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        records = [record for part in batches.values() for record in part]
        if not records:
            return
        epochs = {tp: self._epochs.get(tp, 0) for tp in batches}
        for tp, part in batches.items():
            for record in part:
                self._tracker.started(tp, record.offset)
        task = asyncio.create_task(self._handle_batch(batches, records, epochs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle_batch(
        self,
        batches: dict[TopicPartition, list[ConsumerRecord]],
        records: list[ConsumerRecord],
        epochs: dict[TopicPartition, int],
    ) -> None:
        assert self._batch_handler is not None
        started = time.perf_counter()
        outcome = "ok"
        try:
            with self._record_context(records[0], None):
                await self._batch_handler(records)
        except asyncio.CancelledError:
            return  # not done: stays uncommitted and is redelivered
        except StopService as exc:
            self._stop_service(exc)
            return  # not done: stays uncommitted
        except Exception as exc:  # noqa: BLE001 - every failure is routed, none dropped
            outcome = "dead_letter"
            for record in records:
                if not await self._route_error(record, exc):
                    outcome = "dead_letter_failed"
        _handle_seconds(self._service, records[0].topic).observe(time.perf_counter() - started)
        for tp, part in batches.items():
            _consumed(self._service, tp.topic, outcome).inc(len(part))
            if self._epochs.get(tp, 0) == epochs[tp]:
                for record in part:
                    self._finished(tp, record.offset, epochs[tp], outcome == "ok")
        self._slot_freed.set()

    def _stop_service(self, exc: StopService) -> None:
        log.critical("stopping: %s (its record stays uncommitted)", exc, exc_info=exc.__cause__)
        if self._fatal is not None and not self._fatal.done():
            self._fatal.set_exception(exc)

    async def _route_error(self, record: ConsumerRecord, exc: Exception) -> bool:
        """`on_error` for a record whose handler raised; False (logged) if that failed too."""
        try:
            await self._on_error(record, exc)
            return True
        except Exception:
            # Never fatal: the restarted service would meet the same record and stop again.
            log.exception(
                "could not dead-letter %s[%d]@%d: skipped (it stays in its topic until its retention)",
                record.topic,
                record.partition,
                record.offset,
            )
            return False

    def _record_context(self, record: ConsumerRecord, request_id: str | None) -> AbstractContextManager[object]:
        """The trace context a record is handled in: its CONSUMER span, child of the producer's.

        With tracing off no span is made (nothing would record it): the producer's context is
        made current, so what the handler publishes still carries the record's trace id on.
        """
        parent = trace_context(record.headers)
        if tracing_off():
            return _Attached(parent)
        attributes: dict[str, str | int] = {
            semconv.MESSAGING_SYSTEM: "kafka",
            semconv.MESSAGING_DESTINATION: record.topic,
            semconv.MESSAGING_PARTITION: str(record.partition),
            semconv.MESSAGING_OFFSET: record.offset,
            semconv.LLMBUS_REQUEST_ID: request_id or "",
        }
        if (upgrade_id := header_value(record.headers, UPGRADE_ID)) is not None:
            attributes[semconv.LLMBUS_UPGRADE_ID] = upgrade_id
        span = tracer.start_span(
            f"{record.topic} process", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes
        )
        return trace.use_span(span, end_on_exit=True)

    async def _handle(self, tp: TopicPartition, record: ConsumerRecord, epoch: int) -> None:
        started = time.perf_counter()
        request_id = header_value(record.headers, REQUEST_ID)
        request_id_var.set(request_id)  # each task has its own context: logs carry it
        try:
            with self._record_context(record, request_id):
                await self._handler(record)
            outcome = "ok"
        except asyncio.CancelledError:
            return  # not done: stays uncommitted and is redelivered
        except StopService as exc:
            self._stop_service(exc)
            return  # not done: stays uncommitted
        except Exception as exc:  # noqa: BLE001 - every failure is routed, none dropped
            outcome = "dead_letter" if await self._route_error(record, exc) else "dead_letter_failed"
        _handle_seconds(self._service, record.topic).observe(time.perf_counter() - started)
        _consumed(self._service, record.topic, outcome).inc()
        if self._epochs.get(tp, 0) == epoch:
            self._finished(tp, record.offset, epoch, outcome == "ok")
        self._slot_freed.set()

    async def commit(self) -> None:
        async with self._commit_lock:
            await self._commit_now()

    async def _commit_now(self) -> None:
        offsets = self._tracker.to_commit()
        if not offsets or not self._commit_offsets:
            return
        assigned = self._consumer.assignment()
        offsets = {tp: o for tp, o in offsets.items() if tp in assigned}
        if not offsets:
            return
        to_commit = {tp: OffsetAndMetadata(o, "") for tp, o in offsets.items()}
        if await commit_with_retry(
            lambda: self._consumer.commit(to_commit), self._settings.commit_timeout_s, self._service
        ):
            self._tracker.committed(offsets)

    async def drain(self, grace_s: float) -> None:
        """Let in-flight records finish for up to `grace_s`, cancel the rest, commit what is done."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace_s)
            if pending and self._grace_over is not None:
                log.warning("grace period over: handing back %d records in flight", len(pending))
                await self._grace_over()
                _, pending = await asyncio.wait(pending, timeout=self._settings.stop_timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        try:
            if self._committing is not None:
                await self._committing  # bounded by commit_timeout_s
            await self.commit()
        except Exception:
            log.warning("final commit failed; the uncommitted records will be redelivered", exc_info=True)


class _Attached(AbstractContextManager[None]):
    """`context` made current for a `with` block (a class: @contextmanager's generator costs more per record)."""

    def __init__(self, context: otel_context.Context) -> None:
        self._context = context
        self._token: Token[otel_context.Context] | None = None

    def __enter__(self) -> None:
        self._token = otel_context.attach(self._context)

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            otel_context.detach(self._token)


async def stop_consumer(consumer: AIOKafkaConsumer, timeout_s: float) -> None:
    try:
        await asyncio.wait_for(consumer.stop(), timeout_s)
    except TimeoutError:
        log.warning("consumer did not stop within %.1fs", timeout_s)
