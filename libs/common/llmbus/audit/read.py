"""Reading a whole namespace back from the broker for the audit: every topic, every partition, to the end."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition

from llmbus.audit.check import AuditReport, Seen, audit, request_id_of
from llmbus.bus.admin import open_admin
from llmbus.bus.security import kafka_auth
from llmbus.contract import topics as t
from llmbus.contract.topics import Topics
from llmbus.settings import BusSettings

log = logging.getLogger(__name__)


async def namespace_partitions(settings: BusSettings) -> list[TopicPartition]:
    """Every partition of every topic of the namespace (catalog, dispatch and reply topics alike)."""
    async with open_admin(settings) as admin:
        names = await asyncio.wait_for(admin.list_topics(), settings.admin_timeout_s)
        ours = sorted(n for n in names if n.startswith(settings.topic_prefix) and not n.startswith("__"))
        described = await asyncio.wait_for(admin.describe_topics(ours), settings.admin_timeout_s) if ours else []
    return [TopicPartition(d["topic"], p["partition"]) for d in described for p in d["partitions"]]


async def read_namespace(settings: BusSettings, timeout_s: float = 120.0) -> list[Seen]:
    """Every committed record of the namespace's topics, from the start up to the end as of now."""
    partitions = await namespace_partitions(settings)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        request_timeout_ms=settings.request_timeout_ms,
        max_partition_fetch_bytes=8 * 1024 * 1024,
        **kafka_auth(settings),
    )
    seen: list[Seen] = []
    try:  # a start that fails (times out) is stopped too: an unstopped consumer keeps its connections
        await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
        if not partitions:
            return seen
        consumer.assign(partitions)
        await asyncio.wait_for(consumer.seek_to_beginning(*partitions), settings.admin_timeout_s)
        ends = await asyncio.wait_for(consumer.end_offsets(partitions), settings.admin_timeout_s)
        pending = {tp for tp, end in ends.items() if end > 0}
        for tp in list(pending):
            if await asyncio.wait_for(consumer.position(tp), settings.admin_timeout_s) >= ends[tp]:
                pending.discard(tp)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while pending:
            if loop.time() > deadline:
                raise TimeoutError(f"audit: {len(pending)} partitions not read to their end within {timeout_s}s")
            batches = await consumer.getmany(*pending, timeout_ms=500, max_records=10_000)
            for tp, records in batches.items():
                seen.extend(
                    Seen(r.topic, r.partition, r.offset, r.key, r.value, tuple(r.headers or ())) for r in records
                )
                if records and records[-1].offset + 1 >= ends[tp]:
                    pending.discard(tp)
            for tp in list(pending):  # transaction markers / compaction can leave the last offsets empty
                if await asyncio.wait_for(consumer.position(tp), settings.admin_timeout_s) >= ends[tp]:
                    pending.discard(tp)
    finally:
        await asyncio.wait_for(consumer.stop(), settings.stop_timeout_s)
    log.info("audit read %d records from %d partitions", len(seen), len(partitions))
    return seen


async def audit_namespace(
    settings: BusSettings, sent_ids: list[str], *, account_requests: bool = False, timeout_s: float = 120.0
) -> AuditReport:
    records = await read_namespace(settings, timeout_s)
    return audit(Topics(settings.topic_prefix), records, sent_ids, account_requests=account_requests)


def request_ids_in(topics: Topics, records: list[Seen]) -> list[str]:
    """The request ids clients asked for: every string `request_id` on llm.requests, in order."""
    requests = topics.name(t.REQUESTS)
    ids = (request_id_of(r.value or b"") for r in records if r.topic == requests)
    return list(dict.fromkeys(i for i in ids if i is not None))
