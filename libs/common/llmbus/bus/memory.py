"""The in-memory double of the bus: a service's own bindings run on records held in a list.

`MemoryBus.runtime(contract)` gives a ServiceRuntime whose Publisher writes to the in-memory log
instead of Kafka; `send` puts a record on a topic and `drain` hands every waiting record (those
the test sent and those the service published) to the bindings that read its topic, through the
same decoding, retries and error paths as the real runtime (ServiceRuntime.record_handler, a
subscription's `on_error` or Bus.dead_letter). Its start runs the service's start-up jobs of every
phase (a start-up table is read from the log) and consumes nothing: records are delivered by
`drain`; timers and tasks do not run (a test calls what they would). A tail (`tail`: a gateway's
reply topic) gets every record written to its topic after its start, as it is written. For fast
unit tests of handlers; partitions, groups, offsets and redelivery after a crash are the real
broker's and are tested against it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiokafka.structs import ConsumerRecord

from llmbus.bus import headers as hdr
from llmbus.bus.codec import decode
from llmbus.bus.consumer import StopService
from llmbus.bus.producer import Delivery, Publisher
from llmbus.bus.runtime import Bus
from llmbus.bus.service import Binding, Phase, ServiceRuntime, transient
from llmbus.bus.tail import TopicTail
from llmbus.contract.declarations import Contract
from llmbus.contract.messages import Message
from llmbus.contract.topics import Topics, TopicSpec
from llmbus.settings import BusSettings

M = TypeVar("M", bound=Message)


@dataclass
class MemoryLog:
    records: list[ConsumerRecord] = field(default_factory=list)
    waiting: list[ConsumerRecord] = field(default_factory=list)
    spies: dict[str, list[tuple[type[Message], list[Any]]]] = field(default_factory=dict)
    tails: dict[str, list[asyncio.Queue[ConsumerRecord]]] = field(default_factory=dict)
    _offsets: dict[str, int] = field(default_factory=dict)

    def append(self, topic: str, value: bytes | None, key: str | None, headers: hdr.KafkaHeaders) -> None:
        offset = self._offsets.get(topic, 0)
        self._offsets[topic] = offset + 1
        encoded_key = key.encode() if key is not None else None
        written_ms = time.time_ns() // 1_000_000
        record = ConsumerRecord(
            topic,
            0,
            offset,
            written_ms,
            0,
            encoded_key,
            value,
            None,
            len(encoded_key or b""),
            len(value or b""),
            headers,
        )
        self.records.append(record)
        self.waiting.append(record)
        for model, seen in self.spies.get(topic, ()):
            seen.append(decode(record, model))
        for tail in self.tails.get(topic, ()):
            tail.put_nowait(record)


class MemoryTail(TopicTail):
    """TopicTail on the in-memory log: every record written to its topic after `start`, nothing committed."""

    def __init__(self, log: MemoryLog, settings: BusSettings, topic: str) -> None:  # no consumer
        self.log = log
        self.settings = settings
        self.topic = topic
        self.written: asyncio.Queue[ConsumerRecord] = asyncio.Queue()

    async def start(self) -> TopicTail:
        self.log.tails.setdefault(self.topic, []).append(self.written)
        return self

    async def records(self, timeout_s: float) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (remaining := deadline - loop.time()) > 0:
            try:
                record = await asyncio.wait_for(self.written.get(), remaining)
            except TimeoutError:
                return
            yield record  # type: ignore[misc]  # as TopicTail's: the record

    async def stop(self) -> None:
        tails = self.log.tails.get(self.topic, [])
        if self.written in tails:
            tails.remove(self.written)


class MemoryPublisher(Publisher):
    """The Publisher's interface over the in-memory log (every write acknowledged at once)."""

    def __init__(self, log: MemoryLog, service: str) -> None:
        super().__init__(None, service, send_timeout_s=1.0)  # type: ignore[arg-type]  # no producer
        self.log = log

    async def close(self, timeout_s: float) -> None:
        return None

    async def publish(  # type: ignore[override]  # one signature for both `wait`s: nothing is waited for here
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
        headers = hdr.outgoing(value, self._service, request_id=request_id, tenant=tenant)
        data = payload if payload is not None else None if value is None else value.to_bytes()
        await self._publish_bytes(topic, data, key=key, headers=headers, partition=partition)
        if wait:
            return None
        delivery: Delivery = asyncio.get_running_loop().create_future()
        delivery.set_result(None)
        return delivery

    async def publish_many(self, topic: str, items: Sequence[tuple[Message, bytes | None, str | None]]) -> None:
        for value, payload, key in items:
            await self.publish(topic, value, key=key, payload=payload)

    async def _publish_bytes(
        self,
        topic: str,
        payload: bytes | None,
        *,
        key: str | None,
        headers: hdr.KafkaHeaders,
        partition: int | None = None,
    ) -> None:
        self.log.append(topic, payload, key, headers)
        self._acknowledged(topic)


class EveryTopic:
    """In memory every topic exists (a reply topic a request names, a tenant's)."""

    async def exists(self, topic: str) -> bool:
        return True


class MemoryRuntime(ServiceRuntime):
    """A ServiceRuntime on the in-memory log: no consumers, records delivered by MemoryBus.drain."""

    def __init__(self, bus: Bus, contract: Contract, log: MemoryLog, max_attempts: int) -> None:
        super().__init__(bus, contract, max_attempts=max_attempts, retry_first_s=0.01)
        self.log = log

    async def _open_loops(self) -> None:
        return None

    async def _follow(self) -> None:
        self.caught_up.set()  # what the log holds is delivered by drain, in order

    async def _serve(self) -> None:
        return None

    async def _start_background(self, phase: Phase) -> None:
        return None  # a test calls what a timer or task would

    async def _close_consumers(self) -> None:
        return None

    async def ensure_topics(self, topics: list[tuple[str, TopicSpec]]) -> None:
        return None  # every topic exists in memory

    def tail(self, name: str, **names: str) -> TopicTail:
        return MemoryTail(self.log, self.settings, self._tail_topic(name, names))

    async def read_since(self, name: str, since_ms: int, timeout_s: float) -> list[Any]:
        reads = self._at_start(name)
        topic = self.topics.name(reads.topics[0])
        return [
            decode(record, reads.model)
            for record in self.log.records
            if record.topic == topic and record.value is not None and record.timestamp >= since_ms
        ]

    async def read_table(self, name: str, key_of: Callable[[Any], str] | None = None) -> dict[str, Any]:
        reads = self._at_start(name)
        topic = self.topics.name(reads.topics[0])
        table: dict[str, Any] = {}
        for record in self.log.records:
            if record.topic != topic or record.key is None:
                continue
            if record.value is None:
                table.pop(record.key.decode(), None)
                continue
            value = decode(record, reads.model)
            table[key_of(value) if key_of else record.key.decode()] = value
        return table


class MemoryBus:
    """One in-memory log shared by the services and the test that drives them."""

    def __init__(self, settings: BusSettings | None = None) -> None:
        self.settings = settings or BusSettings()
        self.topics = Topics(self.settings.topic_prefix)
        self.log = MemoryLog()
        self.runtimes: list[ServiceRuntime] = []

    def runtime(self, contract: Contract, max_attempts: int = 3) -> ServiceRuntime:
        """A service's runtime on this log. A transient failure is retried `max_attempts` times, then
        raised out of `send`/`drain` (on Kafka the record would stay uncommitted: send it again)."""
        publisher = MemoryPublisher(self.log, contract.service)
        bus = Bus(self.settings, contract.service, self.topics, publisher, directory=EveryTopic())
        runtime = MemoryRuntime(bus, contract, self.log, max_attempts)
        self.runtimes.append(runtime)
        return runtime

    async def send(self, topic: str, value: Message | bytes | None, key: str | None = None) -> None:
        """Put a record on `topic` (a message, raw bytes or a tombstone) and deliver everything waiting."""
        if isinstance(value, Message):
            self.log.append(topic, value.to_bytes(), key, hdr.outgoing(value, "test"))
        else:
            self.log.append(topic, value, key, [])
        await self.drain()

    async def drain(self) -> None:
        """Deliver waiting records, one at a time in the order written, until none is left."""
        while self.log.waiting:
            record = self.log.waiting.pop(0)
            for runtime in self.runtimes:
                for binding in runtime.bindings:
                    if self._reads(runtime, binding, record.topic):
                        await self._deliver(runtime, binding, record)

    def _reads(self, runtime: ServiceRuntime, binding: Binding, topic: str) -> bool:
        if binding.pattern is not None:
            return re.fullmatch(binding.pattern, topic) is not None
        return topic in binding.topic_names(runtime.topics)

    async def _deliver(self, runtime: ServiceRuntime, binding: Binding, record: ConsumerRecord) -> None:
        handler = runtime.record_handler(binding)
        try:
            await handler([record] if binding.reads.batch_max_records is not None else record)
        except Exception as exc:
            if isinstance(exc, StopService) or (transient(exc) and binding.retries):
                raise  # retried as often as allowed, or fatal: left for the test to deliver again
            # As ConsumerLoop does: the subscription's error path (the DLQ by default), never fatal.
            await (binding.on_error or runtime.dead_letter)(record, exc)

    def spy(self, topic: str, model: type[M]) -> list[M]:
        """A list that gets every message written to `topic` (a full name) from now on, decoded."""
        seen: list[M] = []
        self.log.spies.setdefault(topic, []).append((model, seen))
        return seen

    def published(self, topic: str, model: type[M]) -> list[M]:
        """The messages on `topic` (a full name), decoded."""
        return [decode(record, model) for record in self.log.records if record.topic == topic]

    def values(self, topic: str) -> list[Any]:
        return [record.value for record in self.log.records if record.topic == topic]
