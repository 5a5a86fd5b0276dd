"""The batch flow: a batch of raw records → rows (a record that does not decode goes to the DLQ) → each target.

The tenant of a request or feedback read from a tenant's own topic (`llm.requests.<tenant>`,
`llm.feedback.<tenant>`, auth on) is its topic's; a body claiming another is dead-lettered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiokafka.structs import ConsumerRecord
from prometheus_client import Counter

from llmbus.archive.rows import Kind, Source, row_of
from llmbus.bus import BadMessage, decode
from llmbus.contract import topics as t
from llmbus.contract.messages import ErrorCode
from llmbus.security import tenancy
from llmbus_services.archive.core.plan import BatchPlan, plan_batch
from llmbus_services.archive.core.ports import ArchiveTarget

log = logging.getLogger(__name__)

ARCHIVED = Counter("llmbus_archive_records_total", "Records the archive handled, by outcome", ["kind", "outcome"])
WRITE_RETRIES = Counter("llmbus_archive_write_retries_total", "Batches written again after a file system error")
FILES = Counter("llmbus_archive_files_total", "Parquet files the archive wrote", ["kind"])

DeadLetter = Callable[[ConsumerRecord, Exception], Awaitable[None]]
TENANT_TOPICS = {"requests": tenancy.source_of, "feedback": tenancy.feedback_source_of}


@dataclass
class ArchiveHandlers:
    stores: list[ArchiveTarget]  # the directory and/or the bucket; each plans and writes the batch itself
    topics: t.Topics
    dead_letter: DeadLetter

    def on_batch(self, kind: Kind) -> Callable[[list[ConsumerRecord]], Awaitable[None]]:
        async def handle(records: list[ConsumerRecord]) -> None:
            rows_by_tp: dict[tuple[str, int], list[dict]] = {}
            offsets_by_tp: dict[tuple[str, int], list[int]] = {}
            for record in records:
                offsets_by_tp.setdefault((record.topic, record.partition), []).append(record.offset)
                try:
                    row = self._row(kind, record)
                except BadMessage as bad:
                    await self.dead_letter(record, bad)
                    ARCHIVED.labels(kind.name, "dead_letter").inc()
                    continue
                rows_by_tp.setdefault((record.topic, record.partition), []).append(row)
            for (topic, partition), offsets in offsets_by_tp.items():
                plan = await self._write_until_done(topic, partition, rows_by_tp.get((topic, partition), []), offsets)
                ARCHIVED.labels(kind.name, "written").inc(plan.rows())
                ARCHIVED.labels(kind.name, "duplicate").inc(plan.duplicates)
                ARCHIVED.labels(kind.name, "redelivered").inc(plan.redelivered)
                FILES.labels(kind.name).inc(len(plan.files))
                if plan.redelivered:
                    log.info("%s[%d]: %d records archived before, skipped", topic, partition, plan.redelivered)

        return handle

    async def _write_until_done(self, topic: str, partition: int, rows: list[dict], offsets: list[int]) -> BatchPlan:
        """A disk that is full or away, or a bucket that fails, holds the batch (uncommitted, retried), never
        sends it to the DLQ."""
        delay_s = 0.5
        while True:
            try:
                return await asyncio.to_thread(self._write, topic, partition, rows, offsets)
            except OSError as exc:
                WRITE_RETRIES.inc()
                log.warning("archive write for %s[%d] failed (%r): retrying in %.1fs", topic, partition, exc, delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 30.0)

    def _row(self, kind: Kind, record: ConsumerRecord) -> dict:
        message = decode(record, kind.model)
        source_of = TENANT_TOPICS.get(kind.name)
        if source_of is not None:
            try:
                source = source_of(record.topic.removeprefix(self.topics.prefix))
                tenant = tenancy.check_tenant(source, message.tenant, what=kind.name)  # type: ignore[attr-defined]
            except tenancy.Refused as refused:
                raise BadMessage(ErrorCode.FORBIDDEN, refused.reason, getattr(message, "request_id", None)) from None
            message = message.model_copy(update={"tenant": tenant})
        return row_of(kind, message, Source(record.topic, record.partition, record.offset, record.timestamp))

    def _write(self, topic: str, partition: int, rows: list[dict], offsets: list[int]) -> BatchPlan:
        """Every target: one that has the batch already (a retry after another target failed) skips it.
        Returns the first target's plan (what the metrics count)."""
        plans = []
        for store in self.stores:
            plan = plan_batch(topic, partition, rows, offsets, store.archived_ranges(topic, partition), store.known_ids)
            if plan.offsets is not None:
                store.write(plan)
            plans.append(plan)
        return plans[0]
