"""Reading a topic up to its end as of now: as a table (every key's latest value), as a log, or from a
time on; and when a group's committed offsets were written."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from llmbus.bus.admin import open_admin
from llmbus.bus.catch_up import assigned_ends, first_records, read_to_end
from llmbus.bus.codec import BadMessage, decode
from llmbus.bus.partitioner import partition_for
from llmbus.bus.security import kafka_auth
from llmbus.contract.messages import Message
from llmbus.settings import BusSettings

M = TypeVar("M", bound=Message)
log = logging.getLogger(__name__)


async def read_table(
    settings: BusSettings,
    topic: str,
    model: type[M],
    timeout_s: float = 10.0,
    key_of: Callable[[M], str] | None = None,
) -> dict[str, M]:
    """Latest value per key of `topic`: a tombstone removes its key; undecodable records are skipped.

    `key_of` keys the table by a field of the value instead of the record key (e.g. request
    id on a topic keyed by model)."""
    table: dict[str, M] = {}
    for key, value in await _read(settings, topic, model, timeout_s):
        if value is None:
            table.pop(key, None)
        else:
            table[key_of(value) if key_of else key] = value
    return table


async def read_log(settings: BusSettings, topic: str, model: type[M], timeout_s: float = 10.0) -> list[tuple[str, M]]:
    """Every (key, message) of `topic` in offset order per partition (tombstones and undecodable records skipped)."""
    return [(key, value) for key, value in await _read(settings, topic, model, timeout_s) if value is not None]


async def _read(settings: BusSettings, topic: str, model: type[M], timeout_s: float) -> list[tuple[str, M | None]]:
    """(key, message or None for a tombstone) up to the end offsets as of now."""
    consumer = reader(settings, topic)
    records: list[tuple[str, M | None]] = []
    try:  # a start that fails (times out) is stopped too: an unstopped consumer keeps its connections
        await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
        started = asyncio.get_running_loop().time()
        ends = await assigned_ends(consumer, timeout_s)
        remaining_s = timeout_s - (asyncio.get_running_loop().time() - started)
        async for record in read_to_end(consumer, ends, remaining_s, call_timeout_s=settings.admin_timeout_s):
            if record.key is not None and record.value is None:
                records.append((record.key.decode(), None))
            elif record.key is not None:
                try:
                    records.append((record.key.decode(), decode(record, model)))
                except BadMessage:
                    continue
    except TimeoutError as exc:  # what came is the answer: a reader of a table starts with what it can get
        log.warning("%s read up to the deadline only: %s", topic, exc)
    finally:
        await asyncio.wait_for(consumer.stop(), settings.stop_timeout_s)
    return records


async def read_since(
    settings: BusSettings, topic: str, model: type[M], since_ms: int, timeout_s: float, key: str | None = None
) -> list[M]:
    """Every message of `topic` whose record was written at or after `since_ms`, up to the end offsets
    as of now (undecodable records skipped); with `key`, only the partition that key's records go to.
    Raises NotReadToEnd (a TimeoutError) if not read to the end in time."""
    out: list[M] = []
    for record in await records_since(settings, topic, since_ms, timeout_s, key):
        try:
            out.append(decode(record, model))
        except BadMessage:
            continue
    return out


async def records_since(
    settings: BusSettings, topic: str, since_ms: int, timeout_s: float, key: str | None = None
) -> list[ConsumerRecord]:
    """`read_since`'s records as read (value, timestamp, headers), tombstones left out."""
    consumer = reader(settings)
    out: list[ConsumerRecord] = []
    try:
        await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
        tps = await partitions_of(settings, [topic])
        if key is not None:
            numbers = [tp.partition for tp in tps]
            tps = [TopicPartition(topic, partition_for(key.encode(), numbers, numbers))]
        consumer.assign(tps)
        ends = await asyncio.wait_for(consumer.end_offsets(tps), settings.admin_timeout_s)
        starts = await asyncio.wait_for(consumer.offsets_for_times(dict.fromkeys(tps, since_ms)), timeout_s)
        for tp in tps:
            found = starts.get(tp)
            consumer.seek(tp, found.offset if found is not None else ends[tp])
        async for record in read_to_end(consumer, ends, timeout_s, call_timeout_s=settings.admin_timeout_s):
            if record.value is not None:
                out.append(record)
    finally:
        await asyncio.wait_for(consumer.stop(), settings.stop_timeout_s)
    return out


async def resume_time_ms(settings: BusSettings, group: str, topic: str, timeout_s: float) -> int | None:
    """When the oldest record `group` will read again from `topic` was written: the earliest record
    timestamp at its committed offsets, or at the log's start on a partition it never committed
    (it reads those from the earliest). None: nothing is left to read again. Raises NotReadToEnd
    (a TimeoutError) when the first records did not all come within `timeout_s`: a later answer could be older."""
    async with open_admin(settings) as admin:
        committed = await asyncio.wait_for(admin.list_consumer_group_offsets(group), settings.admin_timeout_s)
    tps = await partitions_of(settings, [topic])
    consumer = reader(settings)
    try:
        await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
        consumer.assign(tps)
        starts = await asyncio.wait_for(consumer.beginning_offsets(tps), settings.admin_timeout_s)
        ends = await asyncio.wait_for(consumer.end_offsets(tps), settings.admin_timeout_s)
        resume = {}
        for tp in tps:
            meta = committed.get(tp)
            resume[tp] = max(meta.offset, starts[tp]) if meta is not None and meta.offset >= 0 else starts[tp]
        firsts = await first_records(consumer, resume, ends, timeout_s, call_timeout_s=settings.admin_timeout_s)
    finally:
        await asyncio.wait_for(consumer.stop(), settings.stop_timeout_s)
    return min((record.timestamp for record in firsts.values()), default=None)


def reader(settings: BusSettings, *topics: str) -> AIOKafkaConsumer:
    """A group-less consumer that commits nothing: subscribed to `topics` from their start, or, with
    none, for `assign` and `seek` (it starts from the earliest offset wherever a seek falls off the log)."""
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        request_timeout_ms=settings.request_timeout_ms,
        **kafka_auth(settings),
    )


async def partitions_of(settings: BusSettings, topics: list[str]) -> list[TopicPartition]:
    """Every partition of `topics`, from the broker (a group-less consumer knows none yet)."""
    if not topics:
        return []
    async with open_admin(settings) as admin:
        described = await asyncio.wait_for(admin.describe_topics(topics), settings.admin_timeout_s)
    return sorted(TopicPartition(d["topic"], p["partition"]) for d in described for p in d["partitions"])
