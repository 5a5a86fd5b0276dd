"""CostRecords onto llm.costs: one record batch per partition, every ack awaited (bounded).

Why not FastStream's publishing (the service is otherwise a FastStream app): its `publish` costs a
command, a correlation id and a future per record -- a fifth of the service's CPU on a backlog --
and its `publish_batch` has one key policy and one header set per batch, where every CostRecord
carries its own tenant key (its partition) and request id header. This goes through the project's
idempotent producer (`make_producer`: acks=all, idempotence on) and aiokafka's `send_batch`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiokafka.errors import MessageSizeTooLargeError

from llmbus import topics as t
from llmbus.bus import headers as hdr
from llmbus.bus.partitioner import partition_for
from llmbus.bus.producer import PublishTimeout, make_producer
from llmbus.contract.cloudevents import cloudevent_headers, is_cloudevent_header
from llmbus.messages import CostRecord
from llmbus.settings import BusSettings

# (record, its encoded bytes, key)
Items = Sequence[tuple[CostRecord, bytes, str | None]]


class CostsPublisher:
    def __init__(self, settings: BusSettings, topic: str) -> None:
        self.settings = settings
        self.topic = topic
        self.producer = make_producer(settings, f"llmbus-{t.COST}-costs")

    async def start(self) -> None:
        await asyncio.wait_for(self.producer.start(), self.settings.send_timeout_s)

    async def stop(self) -> None:
        await asyncio.wait_for(self.producer.stop(), self.settings.stop_timeout_s)

    async def publish(self, items: Items) -> None:
        producer, topic = self.producer, self.topic
        # The headers hdr.outgoing gives a record, with the trace context taken once: every record of
        # the batch is published in the same context (the handler's).
        common = hdr.outgoing(CostRecord(request_id="", tenant="", model="", cost_usd=0.0), t.COST)
        common = [(k, v) for k, v in common if k not in (hdr.REQUEST_ID, hdr.TENANT) and not is_cloudevent_header(k)]
        sent: list[asyncio.Future[Any]] = []
        try:
            async with asyncio.timeout(self.settings.send_timeout_s):
                partitions = sorted(await producer.partitions_for(topic))
                batches: dict[int, Any] = {}
                for record, payload, key in items:
                    key_bytes = key.encode() if key is not None else None
                    partition = partition_for(key_bytes, partitions, partitions)  # the producer's own choice
                    headers = [(hdr.REQUEST_ID, record.request_id.encode()), (hdr.TENANT, record.tenant.encode())]
                    headers += common
                    headers += cloudevent_headers(record, t.COST)
                    batch = batches.get(partition)
                    if batch is None:
                        batch = batches[partition] = producer.create_batch()
                    if batch.append(key=key_bytes, value=payload, timestamp=None, headers=headers) is None:
                        sent.append(await producer.send_batch(batch, topic, partition=partition))  # full
                        batch = batches[partition] = producer.create_batch()
                        if batch.append(key=key_bytes, value=payload, timestamp=None, headers=headers) is None:
                            raise MessageSizeTooLargeError(f"a CostRecord of {len(payload)} bytes")
                for partition, batch in batches.items():  # each holds at least one record
                    sent.append(await producer.send_batch(batch, topic, partition=partition))
        except TimeoutError as exc:
            raise PublishTimeout(f"Kafka did not take {len(items)} records for {topic} in time") from exc
        try:
            await asyncio.wait_for(asyncio.gather(*sent), self.settings.send_timeout_s)
        except TimeoutError as exc:
            raise PublishTimeout(f"no ack from Kafka for {len(items)} records on {topic}") from exc
