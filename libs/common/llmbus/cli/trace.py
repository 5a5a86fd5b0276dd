"""`llmbus trace <request id>`: a request's lineage read back from the topics alone."""

from __future__ import annotations

import asyncio
import time

import typer
from aiokafka import TopicPartition
from rich.console import Console

from llmbus.bus import BadMessage, decode
from llmbus.bus.admin import open_admin
from llmbus.bus.catch_up import NotReadToEnd, read_to_end
from llmbus.bus.headers import REQUEST_ID, as_dict
from llmbus.bus.tables import partitions_of, read_table, reader
from llmbus.contract import topics as t
from llmbus.contract.messages import Control, NodeProfile, WorkerStatus
from llmbus.domain.lineage import Lineage, render
from llmbus.settings import BusSettings

console = Console(highlight=False)

# Topics on a request's path; per-instance ones (dispatch, gateway replies) are found by prefix.
_FIXED = (t.REQUESTS, t.ROUTED, t.TOKENS, t.SHADOW_TOKENS, t.OUTCOMES, t.RESULTS, t.CONTROL, t.DLQ)
_PREFIXES = (t.DISPATCH_PREFIX, t.REPLIES_PREFIX)


async def _path_partitions(settings: BusSettings) -> list[TopicPartition]:
    """Every partition of the path's topics (from the broker: a group-less consumer knows none yet)."""
    topics = t.Topics(settings.topic_prefix)
    async with open_admin(settings) as admin:
        existing = set(await asyncio.wait_for(admin.list_topics(), settings.admin_timeout_s))
        wanted = {topics.name(base) for base in _FIXED}
        wanted |= {n for n in existing if any(n.startswith(topics.name(p)) for p in _PREFIXES)}
    return await partitions_of(settings, sorted(wanted & existing))


async def read_lineage(settings: BusSettings, request_id: str, since_s: float, timeout_s: float) -> Lineage:
    """Scan the path's topics from `since_s` ago to their end as of now, keeping the request's records."""
    topics = t.Topics(settings.topic_prefix)
    tps = await _path_partitions(settings)
    consumer = reader(settings)
    lineage = Lineage(request_id)
    control_topic = topics.name(t.CONTROL)
    try:  # a start that fails (times out) is stopped too: an unstopped consumer keeps its connections
        await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
        consumer.assign(tps)
        ends = await asyncio.wait_for(consumer.end_offsets(tps), settings.admin_timeout_s)
        since_ms = int((time.time() - since_s) * 1000)
        starts = await asyncio.wait_for(consumer.offsets_for_times(dict.fromkeys(tps, since_ms)), timeout_s)
        for tp in tps:
            found = starts.get(tp)
            consumer.seek(tp, found.offset if found is not None else ends[tp])
        try:
            async for record in read_to_end(consumer, ends, timeout_s, call_timeout_s=settings.admin_timeout_s):
                headers = as_dict(record.headers)
                if headers.get(REQUEST_ID) != request_id and record.topic != control_topic:
                    continue
                try:
                    message = decode(record, topics.spec_of(record.topic).value)
                except BadMessage:
                    continue
                if isinstance(message, Control) and message.target_id != request_id:
                    continue
                lineage.add(message)
        except NotReadToEnd as short:
            console.print(
                f"[yellow]not read to the end within {timeout_s:.0f}s: {len(short.pending)} partitions[/yellow]"
            )
    finally:
        await asyncio.wait_for(consumer.stop(), settings.stop_timeout_s)
    for attempt in lineage.attempts.values():
        attempt.chunks.sort(key=lambda c: c.seq)
    return lineage


def trace(
    request_id: str,
    since_minutes: float = typer.Option(24 * 60, help="read the topics from this long ago"),
    timeout_s: float = typer.Option(60.0, help="give up reading after this long"),
) -> None:
    """Rebuild a request's lineage from the topics: routing, every attempt (worker, node, GPU,
    model version), chunks, cancels, dead letters and the result."""

    async def _trace() -> list[str]:
        settings = BusSettings()
        topics = t.Topics(settings.topic_prefix)
        lineage = await read_lineage(settings, request_id, since_minutes * 60, timeout_s)
        workers = await read_table(settings, topics.name(t.WORKERS), WorkerStatus, timeout_s=10)
        nodes = await read_table(settings, topics.name(t.NODES), NodeProfile, timeout_s=10)
        return render(lineage, workers, nodes)

    for line in asyncio.run(_trace()):
        console.print(line)
