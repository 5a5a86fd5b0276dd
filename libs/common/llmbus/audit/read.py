"""Reading a whole namespace back from the broker for the audit: every topic, every partition, to the end."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition

from llmbus.audit.check import AuditReport, Seen, audit, is_request_topic, request_id_of
from llmbus.bus.admin import open_admin
from llmbus.bus.catch_up import read_to_end
from llmbus.bus.security import kafka_auth
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
        records = read_to_end(consumer, ends, timeout_s, call_timeout_s=settings.admin_timeout_s, max_records=10_000)
        async for r in records:
            seen.append(Seen(r.topic, r.partition, r.offset, r.key, r.value, tuple(r.headers or ()), r.timestamp))
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
    """The request ids clients asked for: every string `request_id` on llm.requests (and the tenants' own
    request topics), in order."""
    ids = (request_id_of(r.value or b"") for r in records if is_request_topic(topics, r.topic))
    return list(dict.fromkeys(i for i in ids if i is not None))
