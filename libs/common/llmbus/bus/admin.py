"""Create or verify topics: idempotent, safe to run from every service and every test."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code
from aiokafka.protocol.api import Response
from aiokafka.protocol.offset import OffsetRequest

from llmbus.bus.security import kafka_auth
from llmbus.contract.topics import CATALOG, PATTERN_SPECS, Topics, TopicSpec
from llmbus.settings import BusSettings

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def open_admin(settings: BusSettings) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started admin client whose start and close are bounded by the admin timeout."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka_bootstrap,
        client_id="llmbus-admin",
        request_timeout_ms=int(settings.admin_timeout_s * 1000),
        **kafka_auth(settings),
    )
    await asyncio.wait_for(admin.start(), settings.admin_timeout_s)
    try:
        yield admin
    finally:
        await asyncio.wait_for(admin.close(), settings.admin_timeout_s)


# Names topic_retention_ms may use: the catalog's, and the per-instance patterns (e.g. "llm.dispatch.<worker_id>").
KNOWN_TOPIC_NAMES = frozenset(spec.name for spec in (*CATALOG, *PATTERN_SPECS))


def topic_config(settings: BusSettings, spec: TopicSpec) -> dict[str, str]:
    """A topic's config: the catalog's, plus the bus-wide durability and size settings.

    min.insync.replicas makes the producers' acks=all mean "on that many brokers"; the size
    limit is the producers' max_request_size plus framing, so what a producer accepts the
    broker accepts too (and nothing a DLQ entry wraps can outgrow it: DLQ payloads are bounded).
    """
    unknown = set(settings.topic_retention_ms) - KNOWN_TOPIC_NAMES
    if unknown:
        raise ValueError(f"topic_retention_ms names topics not in the catalog: {sorted(unknown)}")
    retention = settings.topic_retention_ms.get(spec.name)
    return (
        {
            "min.insync.replicas": str(settings.min_insync_replicas),
            "max.message.bytes": str(settings.topic_max_message_bytes),
        }
        | spec.config()
        | ({"retention.ms": str(retention)} if retention is not None else {})
    )


async def ensure_topics(settings: BusSettings, wanted: list[tuple[str, TopicSpec]]) -> list[str]:
    """Create missing topics with their catalog config; grow partitions that are too few.

    Returns the names it created. Existing topics with more partitions are left alone, and so is
    the config of existing topics (an operator changes a live topic's config deliberately).
    Replication factor and min.insync.replicas come from settings: a factor the cluster cannot
    meet fails here, loudly, instead of quietly keeping one copy.
    """
    async with open_admin(settings) as admin:
        existing = set(await asyncio.wait_for(admin.list_topics(), settings.admin_timeout_s))
        missing = [
            NewTopic(name, spec.partitions, settings.replication_factor, topic_configs=topic_config(settings, spec))
            for name, spec in wanted
            if name not in existing
        ]
        if missing:
            try:
                response = await asyncio.wait_for(admin.create_topics(missing), settings.admin_timeout_s)
            except TopicAlreadyExistsError:  # a concurrent creator won the race
                pass
            else:
                _raise_creation_errors(response)
            log.info("created topics %s", [t.name for t in missing])
            await wait_for_leaders(admin, [t.name for t in missing], settings.admin_timeout_s)
        present = [(name, spec) for name, spec in wanted if name in existing]
        if present:
            await _grow_partitions(admin, present, settings.admin_timeout_s)
        return [t.name for t in missing]


def _raise_creation_errors(response: Response) -> None:
    """aiokafka returns per-topic errors instead of raising them: a bad config or factor must not pass silently."""
    for topic, code, *message in response.topic_errors:
        if code and code != TopicAlreadyExistsError.errno:  # already there: a concurrent creator won the race
            raise for_code(code)(f"creating topic {topic}: {message[0] if message else ''}")


async def wait_for_leaders(admin: AIOKafkaAdminClient, names: list[str], timeout_s: float) -> bool:
    """Wait until every partition of `names` is served by its leader.

    A fresh broker names the leaders a moment after CreateTopics returns and starts serving
    them a moment later still; producing before that only earns NotLeaderForPartition
    retries (a screen of warnings during `make up`). Served = the leader answers ListOffsets.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pending = set(names)
    while pending:
        pending = await _not_served(admin, sorted(pending), timeout_s)
        if not pending:
            return True
        if loop.time() > deadline:
            log.warning("partitions of %d topics still without a serving leader after %.0fs", len(pending), timeout_s)
            return False
        await asyncio.sleep(0.1)
    return True


async def _not_served(admin: AIOKafkaAdminClient, names: list[str], timeout_s: float) -> set[str]:
    described = await asyncio.wait_for(admin.describe_topics(names), timeout_s)
    waiting: set[str] = set()
    by_leader: dict[int, list[tuple[str, int]]] = {}
    for d in described:
        parts = d["partitions"]
        if d["error_code"] != 0 or not parts or any(p["error_code"] != 0 or p["leader"] < 0 for p in parts):
            waiting.add(d["topic"])
            continue
        for p in parts:
            by_leader.setdefault(p["leader"], []).append((d["topic"], p["partition"]))
    for leader, tps in by_leader.items():
        topics: dict[str, list[tuple[int, int]]] = {}
        for topic, partition in tps:
            topics.setdefault(topic, []).append((partition, -1))  # -1: latest offset
        request = OffsetRequest(replica_id=-1, isolation_level=0, topics=list(topics.items()))
        try:  # aiokafka's admin has no ListOffsets call of its own
            response = await asyncio.wait_for(admin._send_request_to_node(leader, request), timeout_s)
        except Exception:
            log.debug("ListOffsets probe failed", exc_info=True)
            continue
        waiting |= {topic for topic, parts in response.topics for part in parts if part[1] != 0}
    return waiting


async def _grow_partitions(admin: AIOKafkaAdminClient, present: list[tuple[str, TopicSpec]], timeout_s: float) -> None:
    described = await asyncio.wait_for(admin.describe_topics([n for n, _ in present]), timeout_s)
    counts = {d["topic"]: len(d["partitions"]) for d in described}
    grow = {
        n: NewPartitions(spec.partitions) for n, spec in present if counts.get(n, spec.partitions) < spec.partitions
    }
    if grow:
        await asyncio.wait_for(admin.create_partitions(grow), timeout_s)
        log.info("grew partitions of %s", sorted(grow))


async def topics_matching(settings: BusSettings, pattern: re.Pattern[str]) -> list[str]:
    """The names of the topics that exist now and match (as this principal may see them)."""
    async with open_admin(settings) as admin:
        names = await asyncio.wait_for(admin.list_topics(), settings.admin_timeout_s)
    return sorted(n for n in names if pattern.match(n))


async def delete_topics_matching(settings: BusSettings, pattern: re.Pattern[str]) -> list[str]:
    """Delete every topic whose name matches (test namespaces, for one); returns the names."""
    async with open_admin(settings) as admin:
        names = [n for n in await asyncio.wait_for(admin.list_topics(), settings.admin_timeout_s) if pattern.match(n)]
        for start in range(0, len(names), 200):  # bounded requests on a broker with thousands of topics
            await asyncio.wait_for(admin.delete_topics(names[start : start + 200]), settings.admin_timeout_s)
        return names


async def ensure_catalog(settings: BusSettings) -> list[str]:
    return await ensure_topics(settings, Topics(settings.topic_prefix).all_specs())
