"""One runtime for a service: its declared subscriptions, the one Publisher, the DLQ, timers, start/drain/stop.

A service declares what it reads and writes once (llmbus.contract.contracts); here each declared
subscription is bound to a handler and run by a ConsumerLoop, and everything the service
publishes goes through the Bus's Publisher (retries, batches kept through a leader change, a new
producer when the broker refuses the old one's sequence). llmbus.bus.memory runs the same
bindings in memory for unit tests.

Delivery rule for every subscription: at least once. A record's offset is committed only after
its handler returned, with what it published acknowledged. A record that does not decode, or
that the handler refuses (BadMessage), goes to llm.dlq with the reason (llmbus.bus.dlq: bounded,
retried, never fatal). A transient failure (Redis or Kafka away or slow) is retried in place with
backoff, the partition waiting behind it, until it succeeds or the service stops (then the record
stays uncommitted and is delivered again); any other exception goes to the DLQ as `internal`.

Why FastStream is not the consumer engine here, though it is the project's chosen framework:
ConsumerLoop keeps several records of one partition in flight and still commits in offset order
(the router, scheduler and workers need that), pauses and rewinds under backpressure instead of
dropping, has a poll watchdog and a rebalance-aware commit point; FastStream's subscribers handle
a partition one message at a time and their default ack policy commits before the handler runs
(at most once), which is how three services lost records. Its specification generator needs a
broker with live handlers and inlines every schema, where ours (llmbus.contract.schemagen, from the
declarations) refers to the committed JSON Schemas and carries the catalog's Kafka bindings. What
FastStream's examples taught stays: typed handlers, the declaration apart from the wiring, and
one test body in memory (llmbus.bus.memory) and against the real broker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord
from prometheus_client import Counter
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llmbus.bus.catch_up import wait_assigned
from llmbus.bus.codec import decode
from llmbus.bus.consumer import ConsumerLoop, make_consumer, stop_consumer
from llmbus.bus.holds import Holds
from llmbus.bus.producer import Publisher, PublishTimeout
from llmbus.bus.runtime import Bus, run_until_stopped
from llmbus.bus.tables import read_table
from llmbus.contract.declarations import Contract, Reads
from llmbus.contract.topics import Topics
from llmbus.process.periodic import run_every
from llmbus.settings import BusSettings

log = logging.getLogger(__name__)

HANDLER_RETRIES = Counter(
    "llmbus_handler_retries_total", "Handler calls retried after a transient failure", ["service", "topic"]
)
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 5.0

Job = Callable[[], Awaitable[object]]
HOW_READ = {"batch_max_records", "max_in_flight"}  # what a service's settings may change in a declaration


def transient(exc: BaseException) -> bool:
    """Redis or Kafka away or slow: the same call may succeed later, so the record waits, not the DLQ."""
    if isinstance(exc, (TimeoutError, ConnectionError, PublishTimeout, RedisConnectionError, RedisTimeoutError)):
        return True
    return isinstance(exc, KafkaError) and bool(exc.retriable)


@dataclass
class Binding:
    """A declared subscription bound to its handler (and, for a pattern subscription, the pattern)."""

    reads: Reads
    handler: Callable[[Any], Awaitable[object]]
    pattern: str | None = None
    consumer_options: dict[str, object] = field(default_factory=dict)
    holds: Holds[Any] | None = None  # records the handler keeps open after it returns (llmbus.bus.holds)

    def topic_names(self, topics: Topics) -> list[str]:
        return [topics.name(topic) for topic in self.reads.topics if "<" not in topic]


@dataclass
class Timer:
    interval_s: float
    name: str
    job: Job


class ServiceRuntime:
    """The bindings, timers and life cycle of one service over a Bus (real, or llmbus.bus.memory's)."""

    def __init__(
        self, bus: Bus, contract: Contract, *, max_attempts: int | None = None, retry_first_s: float = RETRY_FIRST_S
    ) -> None:
        """`max_attempts`: a transient failure is raised after so many (None: retried until it
        succeeds or the service stops; the in-memory double bounds it, and a test sees it)."""
        if contract.service != bus.service:
            raise ValueError(f"contract of {contract.service} on the bus of {bus.service}")
        self.bus = bus
        self.contract = contract
        self.bindings: list[Binding] = []
        self.timers: list[Timer] = []
        self._consumers: list[AIOKafkaConsumer] = []
        self._joins: list[AIOKafkaConsumer] = []  # start at the log's end: started once assigned
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._max_attempts = max_attempts
        self._retry_first_s = retry_first_s

    @classmethod
    async def connect(cls, settings: BusSettings, contract: Contract) -> ServiceRuntime:
        return cls(await Bus.start(settings, contract.service), contract)

    @property
    def publisher(self) -> Publisher:
        return self.bus.publisher

    @property
    def topics(self) -> Topics:
        return self.bus.topics

    @property
    def settings(self) -> BusSettings:
        return self.bus.settings

    def subscribe(
        self,
        name: str,
        handler: Callable[[Any], Awaitable[object]],
        *,
        pattern: str | None = None,
        consumer_options: dict[str, object] | None = None,
        holds: Holds[Any] | None = None,
        **overrides: Any,
    ) -> None:
        """Bind the declared subscription `name` to `handler` (a typed one gets the decoded message,
        a `raw` one the record, a batch one the list of records). `overrides` change how it is read
        (batch size, concurrency), never what: a subscription's topics are its declaration's.
        `holds`: records the handler holds there stay uncommitted until it releases them."""
        if unknown := set(overrides) - HOW_READ:
            raise ValueError(f"a subscription reads what its declaration names: {sorted(unknown)} cannot change")
        reads = dataclasses.replace(self.contract.subscription(name), **overrides)
        self.bindings.append(Binding(reads, handler, pattern, dict(consumer_options or {}), holds))

    async def read_table(self, name: str) -> dict[str, Any]:
        """The declared start-up read `name` (`at_start`): every key's latest value, as of now."""
        reads = self.contract.subscription(name)
        if not reads.at_start or len(reads.topics) != 1:
            raise ValueError(f"{name!r} is not a start-up read of one topic")
        topic = self.topics.name(reads.topics[0])
        return await read_table(self.settings, topic, reads.model, timeout_s=self.settings.admin_timeout_s)

    def every(self, interval_s: float, name: str, job: Job) -> None:
        """A periodic job; a failed run is logged and the next one comes at the next interval."""
        self.timers.append(Timer(interval_s, name, job))

    async def dead_letter(self, record: ConsumerRecord, exc: Exception) -> None:
        """The one DLQ path, for handlers that dead-letter one record of a batch themselves."""
        await self.bus.dead_letter(record, exc)

    def record_handler(self, binding: Binding) -> Callable[[Any], Awaitable[None]]:
        """What the consumer calls for a record (or a batch): decode, handle, retry what is transient."""
        reads, handler = binding.reads, binding.handler
        service = self.contract.service

        async def retried(arg: Any, topic: str) -> None:
            delay_s = self._retry_first_s
            attempts = 0
            while True:
                try:
                    await handler(arg)
                    return
                except Exception as exc:
                    attempts += 1
                    if not transient(exc) or attempts == self._max_attempts:
                        raise
                    HANDLER_RETRIES.labels(service, topic).inc()
                    log.warning("%s on %s failed (%r): retrying in %.1fs", reads.name, topic, exc, delay_s)
                    await asyncio.sleep(delay_s)
                    delay_s = min(delay_s * 2, RETRY_MAX_S)

        if reads.batch_max_records is not None:

            async def on_batch(records: list[ConsumerRecord]) -> None:
                await retried(records, records[0].topic)

            return on_batch
        if reads.raw:

            async def on_raw(record: ConsumerRecord) -> None:
                await retried(record, record.topic)

            return on_raw
        model = reads.model

        async def on_record(record: ConsumerRecord) -> None:
            await retried(decode(record, model), record.topic)  # BadMessage → the DLQ with its reason

        return on_record

    def _loop(self, binding: Binding) -> ConsumerLoop:
        reads, settings, service = binding.reads, self.settings, self.contract.service
        group_id = reads.group_id(self.topics, service)
        consumer = make_consumer(
            settings,
            group_id=group_id,
            client_id=f"llmbus-{service}-{reads.name}",
            from_beginning=reads.from_earliest,
            **binding.consumer_options,
        )
        handler = self.record_handler(binding)
        batch = reads.batch_max_records is not None
        loop = ConsumerLoop(
            consumer,
            self._unused if batch else handler,
            self.bus.dead_letter,
            settings,
            service=service,
            max_in_flight=reads.max_in_flight,
            commit_offsets=group_id is not None,
            batch_handler=handler if batch else None,
            batch_max_records=reads.batch_max_records or 1,
            holds=binding.holds,
        )
        listener = loop.rebalance_listener()
        if binding.pattern is not None:
            consumer.subscribe(pattern=binding.pattern, listener=listener)
        else:
            consumer.subscribe(binding.topic_names(self.topics), listener=listener)
        self._consumers.append(consumer)
        if not reads.from_earliest and group_id is not None:
            self._joins.append(consumer)
        return loop

    @staticmethod
    async def _unused(record: ConsumerRecord) -> None:
        raise RuntimeError("a batch subscription's records go to its batch handler")

    async def start(self) -> None:
        """Start every bound subscription's consumer and loop, and the timers."""
        loops = [self._loop(binding) for binding in self.bindings]
        for consumer in self._consumers:
            await asyncio.wait_for(consumer.start(), self.settings.admin_timeout_s)
        # A subscription from the latest offset skips what is published before its group has
        # placed it: start() returns once it has (bounded), so nothing published after is missed.
        for consumer in self._joins:
            await wait_assigned(consumer, self.settings.admin_timeout_s)
        self._tasks = [asyncio.create_task(loop.run(self._stop)) for loop in loops]
        self._tasks += [
            asyncio.create_task(run_every(timer.interval_s, timer.job, name=timer.name, stop=self._stop))
            for timer in self.timers
        ]

    async def wait(self, stop: asyncio.Event) -> None:
        """Until `stop` is set or a loop fails (its error is raised after the others drained)."""
        stopper = asyncio.create_task(self._stop_on(stop))
        try:
            if self._tasks:
                await run_until_stopped(self._tasks, self._stop)
            else:  # nothing bound (a service of timers only that has none): until told to stop
                await self._stop.wait()
        finally:
            stopper.cancel()

    async def _stop_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._stop.set()

    async def stop(self) -> None:
        """Drain (in-flight records finish or stay uncommitted), commit, close consumers and producer."""
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for consumer in self._consumers:
            await stop_consumer(consumer, self.settings.stop_timeout_s)
        await self.bus.stop()
