"""`llmbus gc`: delete what workers and gateways gone for longer than a retention left behind.

Every worker has its own dispatch topic (`llm.dispatch.<worker id>`), two consumer groups and
an `llm.workers` key; every gateway instance its reply topic (`llm.replies.gw-<instance>`).
Nothing else removes them when an instance goes for good (a pod replaced under a new name).

An instance's last sign of life is the newest of its last heartbeat on the compacted
`llm.workers` (read to the end) and the newest record on its own topic (a gateway publishes
no heartbeat: its reply topic's last write is all there is). An instance with no sign at all
(an empty topic, no heartbeat) is kept: its age cannot be told, and deleting a live idle
gateway's reply topic would break it.

For a gone worker: its dispatch topic and groups are deleted, a tombstone is written for its
`llm.workers` key, and cost-accounting's GPU-ledger lease and cursor of it are dropped. Results
held for it (`{<prefix>cost}:pending:<worker>`, not billed yet) are kept and reported: they expire on
their own TTL, and deleting them would lose a bill.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field

import typer
from aiokafka.errors import for_code
from aiokafka.protocol.admin import DeleteGroupsRequest
from rich.console import Console

from llmbus.bus.admin import open_admin
from llmbus.bus.catch_up import NotReadToEnd, first_records
from llmbus.bus.tables import partitions_of, read_table, reader
from llmbus.cli.experiments import publish_record
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import WorkerStatus
from llmbus.security.tenancy import RESERVED_TENANT_PREFIXES
from llmbus.settings import BusSettings
from llmbus.state.keys import cost_key_root
from llmbus.state.store import redis_client

log = logging.getLogger(__name__)

console = Console()

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_INSTANCE = r"([A-Za-z0-9._-]+)"
GROUP_ID_NOT_FOUND = 69  # Kafka's error codes: nothing to delete;
NON_EMPTY_GROUP = 68  # the group has members now: someone consumes as that worker again


def parse_duration_ms(text: str) -> int:
    """'90s', '30m', '12h', '7d' → milliseconds; anything else is a clear error."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"duration {text!r}: expected a number and a unit s, m, h or d (e.g. 7d)")
    return int(float(match.group(1)) * _UNITS_S[match.group(2)] * 1000)


# --- what is gone: pure ----------------------------------------------------------------------


@dataclass(frozen=True)
class Gone:
    kind: str  # "worker" | "gateway"
    instance: str
    last_seen_ms: int
    topic: str | None  # its dispatch / reply topic, where one exists
    groups: tuple[str, ...] = ()
    tombstone: bool = False  # it has an llm.workers key


@dataclass
class GcPlan:
    gone: list[Gone] = field(default_factory=list)
    kept_unknown: list[str] = field(default_factory=list)  # topics without any sign of life


def _last_seen(*times_ms: int | None) -> int | None:
    known = [ms for ms in times_ms if ms is not None]
    return max(known) if known else None


def plan_gc(
    topics: t.Topics,
    now_ms: int,
    older_than_ms: int,
    heartbeats_ms: dict[str, int],
    dispatch_last_ms: dict[str, int | None],
    replies_last_ms: dict[str, int | None],
) -> GcPlan:
    """Which instances are gone: last sign of life older than `older_than_ms` before `now_ms`.

    heartbeats_ms: worker id → its last heartbeat's sent_at_ms; dispatch_last_ms / replies_last_ms:
    worker id / gateway instance → the newest record's timestamp on its topic (None: empty)."""
    plan = GcPlan()
    cutoff_ms = now_ms - older_than_ms
    for worker_id in sorted(set(heartbeats_ms) | set(dispatch_last_ms)):
        seen_ms = _last_seen(heartbeats_ms.get(worker_id), dispatch_last_ms.get(worker_id))
        topic = topics.dispatch(worker_id) if worker_id in dispatch_last_ms else None
        if seen_ms is None:
            plan.kept_unknown.append(topics.dispatch(worker_id))
        elif seen_ms < cutoff_ms:
            groups = tuple(
                g
                for name in ("dispatch", "control")
                if (g := contracts.WORKER.group_id(name, topics, worker_id=worker_id)) is not None
            )
            plan.gone.append(Gone("worker", worker_id, seen_ms, topic, groups, tombstone=worker_id in heartbeats_ms))
    for instance, last_ms in sorted(replies_last_ms.items()):
        if last_ms is None:
            plan.kept_unknown.append(topics.replies(instance))
        elif last_ms < cutoff_ms:
            plan.gone.append(Gone("gateway", instance, last_ms, topics.replies(instance)))
    return plan


def instance_topics(topics: t.Topics, names: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Dispatch topics by worker id and gateway reply topics by instance, among `names`.

    Only gateways' reply topics (`llm.replies.gw-…`): a tenant's own reply topics are not an
    instance's and are never collected."""
    prefix = re.escape(topics.prefix)
    dispatch = re.compile(rf"^{prefix}{re.escape(t.DISPATCH_PREFIX)}{_INSTANCE}$")
    gateway = "|".join(re.escape(p) for p in RESERVED_TENANT_PREFIXES)
    replies = re.compile(rf"^{prefix}{re.escape(t.REPLIES_PREFIX)}((?:{gateway})[A-Za-z0-9._-]+)$")
    workers = {m.group(1): n for n in names if (m := dispatch.match(n))}
    gateways = {m.group(1): n for n in names if (m := replies.match(n))}
    return workers, gateways


# --- reading and deleting ---------------------------------------------------------------------


async def last_write_ms(
    settings: BusSettings, topic_names: list[str], timeout_s: float = 10.0
) -> dict[str, int | None]:
    """The newest record's timestamp of each topic (None: no record left on any partition)."""
    newest: dict[str, int | None] = dict.fromkeys(topic_names)
    if not topic_names:
        return newest
    partitions = await partitions_of(settings, topic_names)
    consumer = reader(settings)
    try:
        await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
        consumer.assign(partitions)
        starts = await asyncio.wait_for(consumer.beginning_offsets(partitions), settings.admin_timeout_s)
        ends = await asyncio.wait_for(consumer.end_offsets(partitions), settings.admin_timeout_s)
        lasts = {tp: max(ends[tp] - 1, starts[tp]) for tp in partitions}
        try:
            found = await first_records(consumer, lasts, ends, timeout_s, call_timeout_s=settings.admin_timeout_s)
        except NotReadToEnd as short:  # a partition not read is no proof of an idle topic: keep its topic
            log.warning("last records not read in time: %s", short)
            found = {}
    finally:
        await asyncio.wait_for(consumer.stop(), settings.stop_timeout_s)
    for tp, record in found.items():
        newest[tp.topic] = max(record.timestamp, newest[tp.topic] or record.timestamp)
    return newest


async def delete_groups(settings: BusSettings, groups: list[str]) -> list[str]:
    """Delete consumer groups (each at its coordinator); one that does not exist is no error.

    Returns the groups kept because they have members (deleting those is refused by the broker)."""
    kept: list[str] = []
    async with open_admin(settings) as admin:
        for group in groups:
            node_id = await asyncio.wait_for(admin.find_coordinator(group), settings.admin_timeout_s)
            response = await asyncio.wait_for(
                admin._send_request_to_node(node_id, DeleteGroupsRequest([group])), settings.admin_timeout_s
            )
            for _, code in response.results:
                if code == NON_EMPTY_GROUP:
                    kept.append(group)
                elif code and code != GROUP_ID_NOT_FOUND:
                    raise for_code(code)(f"deleting consumer group {group}")
    return kept


async def collect(settings: BusSettings, now_ms: int, older_than_ms: int) -> GcPlan:
    topics = t.Topics(settings.topic_prefix)
    fleet = await read_table(settings, topics.name(t.WORKERS), WorkerStatus)
    async with open_admin(settings) as admin:
        names = sorted(await asyncio.wait_for(admin.list_topics(), settings.admin_timeout_s))
    workers, gateways = instance_topics(topics, names)
    written = await last_write_ms(settings, [*workers.values(), *gateways.values()])
    return plan_gc(
        topics,
        now_ms,
        older_than_ms,
        {worker_id: status.sent_at_ms for worker_id, status in fleet.items()},
        {w: written[name] for w, name in workers.items()},
        {g: written[name] for g, name in gateways.items()},
    )


async def remove(settings: BusSettings, plan: GcPlan) -> list[str]:
    """Delete what the plan names; returns notes on what was kept (results held, not billed)."""
    notes: list[str] = []
    doomed = [g.topic for g in plan.gone if g.topic is not None]
    if doomed:
        async with open_admin(settings) as admin:
            await asyncio.wait_for(admin.delete_topics(doomed), settings.admin_timeout_s)
    busy = await delete_groups(settings, [group for g in plan.gone for group in g.groups])
    notes += [f"kept consumer group {group}: it has members again" for group in busy]
    for g in plan.gone:
        if g.tombstone:
            await publish_record(settings, t.WORKERS, g.instance, None)
    workers = [g.instance for g in plan.gone if g.kind == "worker"]
    if workers:
        root = cost_key_root(settings.topic_prefix)  # cost-accounting's keys
        redis = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
        try:
            async with redis.pipeline(transaction=False) as pipe:
                for worker_id in workers:
                    pipe.delete(f"{root}owner:{worker_id}")
                    pipe.hdel(f"{root}cursor", worker_id)
                    pipe.hlen(f"{root}pending:{worker_id}")
                replies = await pipe.execute()
            for worker_id, held in zip(workers, replies[2::3], strict=True):
                if held:
                    notes.append(f"kept {root}pending:{worker_id}: {held} result(s) held, not billed yet")
        finally:
            await redis.aclose()
    return notes


def gc(
    older_than: str = typer.Option(..., help="retention: instances silent for longer are gone (e.g. 7d, 12h)"),
    dry_run: bool = typer.Option(False, help="list what would be deleted; delete nothing"),
) -> None:
    """Delete the topics, consumer groups and keys of workers and gateways gone for longer than a retention."""
    try:
        older_than_ms = parse_duration_ms(older_than)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--older-than") from exc
    settings = BusSettings()
    now_ms = int(time.time() * 1000)
    plan = asyncio.run(collect(settings, now_ms, older_than_ms))
    verb = "would delete" if dry_run else "deleting"
    for g in plan.gone:
        age_h = (now_ms - g.last_seen_ms) / 3_600_000
        parts = [p for p in (g.topic, *g.groups, f"{t.WORKERS} key" if g.tombstone else None) if p]
        console.print(f"{verb} {g.kind} {g.instance} (silent {age_h:.1f} h): {', '.join(parts)}")
    for topic in plan.kept_unknown:
        console.print(f"[dim]kept {topic}: no record and no heartbeat, its age is unknown[/dim]")
    if not plan.gone:
        console.print("nothing gone for longer than " + older_than)
    elif not dry_run:
        for note in asyncio.run(remove(settings, plan)):
            console.print(f"[dim]{note}[/dim]")
        console.print(f"removed {len(plan.gone)} instance(s)")
