"""Reading a topic up to its end as of now: as a table (every key's latest value) or as a log."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from aiokafka import AIOKafkaConsumer

from llmbus.bus.codec import BadMessage, decode
from llmbus.bus.security import kafka_auth
from llmbus.contract.messages import Message
from llmbus.settings import BusSettings

M = TypeVar("M", bound=Message)


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
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        request_timeout_ms=settings.request_timeout_ms,
        **kafka_auth(settings),
    )
    log: list[tuple[str, M | None]] = []
    try:  # a start that fails (times out) is stopped too: an unstopped consumer keeps its connections
        await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not consumer.assignment() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        partitions = list(consumer.assignment())
        ends = await asyncio.wait_for(consumer.end_offsets(partitions), settings.admin_timeout_s)
        pending = {tp for tp, end in ends.items() if end > 0}
        while pending and loop.time() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                for record in records:
                    if record.key is not None and record.value is None:
                        log.append((record.key.decode(), None))
                    elif record.key is not None:
                        try:
                            log.append((record.key.decode(), decode(record, model)))
                        except BadMessage:
                            continue
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
    finally:
        await asyncio.wait_for(consumer.stop(), settings.stop_timeout_s)
    return log
