"""The in-memory double of the bus: a service's own bindings run on records held in a list.

`MemoryBus.runtime(contract)` gives a ServiceRuntime whose Publisher writes to the in-memory log
instead of Kafka; `send` puts a record on a topic and `drain` hands every waiting record (those
the test sent and those the service published) to the bindings that read its topic, through the
same decoding, retries and DLQ as the real runtime (ServiceRuntime.record_handler, Bus.dead_letter).
For fast unit tests of handlers; partitions, groups, offsets and redelivery after a crash are the
real broker's and are tested against it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiokafka.structs import ConsumerRecord

from llmbus.bus import headers as hdr
from llmbus.bus.codec import decode
from llmbus.bus.producer import Publisher
from llmbus.bus.runtime import Bus
from llmbus.bus.service import Binding, ServiceRuntime, transient
from llmbus.contract.declarations import Contract
from llmbus.contract.messages import Message
from llmbus.contract.topics import Topics
from llmbus.settings import BusSettings

M = TypeVar("M", bound=Message)


@dataclass
class MemoryLog:
    records: list[ConsumerRecord] = field(default_factory=list)
    waiting: list[ConsumerRecord] = field(default_factory=list)
    spies: dict[str, list[tuple[type[Message], list[Any]]]] = field(default_factory=dict)
    _offsets: dict[str, int] = field(default_factory=dict)

    def append(self, topic: str, value: bytes | None, key: str | None, headers: hdr.KafkaHeaders) -> None:
        offset = self._offsets.get(topic, 0)
        self._offsets[topic] = offset + 1
        encoded_key = key.encode() if key is not None else None
        record = ConsumerRecord(
            topic, 0, offset, 0, 0, encoded_key, value, None, len(encoded_key or b""), len(value or b""), headers
        )
        self.records.append(record)
        self.waiting.append(record)
        for model, seen in self.spies.get(topic, ()):
            seen.append(decode(record, model))


class MemoryPublisher(Publisher):
    """The Publisher's interface over the in-memory log (every write acknowledged at once)."""

    def __init__(self, log: MemoryLog, service: str) -> None:
        super().__init__(None, service, send_timeout_s=1.0)  # type: ignore[arg-type]  # no producer
        self.log = log

    async def close(self, timeout_s: float) -> None:
        return None

    async def publish(
        self,
        topic: str,
        value: Message,
        *,
        key: str | None,
        partition: int | None = None,
        request_id: str | None = None,
        tenant: str | None = None,
        retry_for_s: float = 0.0,
    ) -> None:
        headers = hdr.outgoing(value, self._service, request_id=request_id, tenant=tenant)
        await self.publish_raw(topic, value.to_bytes(), key=key, headers=headers, partition=partition)

    async def send(
        self,
        topic: str,
        value: Message,
        *,
        key: str | None,
        request_id: str | None = None,
        tenant: str | None = None,
        payload: bytes | None = None,
        retry_for_s: float = 0.0,
    ) -> asyncio.Future[object]:
        headers = hdr.outgoing(value, self._service, request_id=request_id, tenant=tenant)
        await self.publish_raw(topic, value.to_bytes() if payload is None else payload, key=key, headers=headers)
        delivery: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        delivery.set_result(None)
        return delivery

    async def send_batch(
        self, topic: str, items: Sequence[tuple[Message, bytes | None, str | None]]
    ) -> list[asyncio.Future[object]]:
        return [await self.send(topic, value, key=key, payload=payload) for value, payload, key in items]

    async def publish_raw(
        self,
        topic: str,
        payload: bytes,
        *,
        key: str | None,
        headers: hdr.KafkaHeaders,
        partition: int | None = None,
    ) -> None:
        self.log.append(topic, payload, key, headers)
        self._acknowledged(topic)


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
        bus = Bus(self.settings, contract.service, self.topics, publisher)
        runtime = ServiceRuntime(bus, contract, max_attempts=max_attempts, retry_first_s=0.01)
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
            if transient(exc):
                raise  # retried as often as allowed: left for the test to deliver again
            await runtime.dead_letter(record, exc)  # as ConsumerLoop does: to the DLQ, never fatal

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
