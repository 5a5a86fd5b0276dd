"""Dead letters put back where they came from: `llmbus dlq replay`.

A dead letter (llmbus.bus.dlq) keeps a bounded copy of a record and where the whole record is: its
source topic, partition and offset. Replaying one reads that record (key, value, headers) from its
topic and writes it to the same topic again, with a header naming the original
(`llmbus-replayed-from: <topic>/<partition>/<offset>`), so every consumer of the topic handles it
again. A record no longer in its topic (past its retention) is replayed from the letter's copy when
the letter kept it whole, else reported and left.

Replaying is idempotent in effect, not in records: a letter replayed twice puts two copies on the
topic, and each consumer's own once-only markers make the second one a no-op (cost-accounting's seen
markers and record ids: a result billed once is skipped when it comes again; the final markers for
requests; the comparator's pair markers). What each marker guarantees is docs/delivery.md's.
"""

from __future__ import annotations

import asyncio
import base64
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from llmbus.bus.producer import make_producer
from llmbus.bus.tables import read_since, reader
from llmbus.contract import topics as t
from llmbus.contract.declarations import catalog_name
from llmbus.contract.messages import DeadLetter
from llmbus.settings import BusSettings

REPLAYED_FROM = "llmbus-replayed-from"

Where = tuple[str, int, int]  # source topic, partition, offset


def where(letter: DeadLetter) -> Where:
    return letter.source_topic, letter.source_partition, letter.source_offset


@dataclass
class ReplayReport:
    replayed: list[Where] = field(default_factory=list)
    from_letter: list[Where] = field(default_factory=list)  # the record was gone; the letter's whole copy went
    gone: list[Where] = field(default_factory=list)  # past retention and cut in the letter: not replayed

    def summary(self) -> str:
        return (
            f"{len(self.replayed)} replayed ({len(self.from_letter)} from the letter's copy), "
            f"{len(self.gone)} gone from their topic and cut in the letter"
        )


async def dead_letters(
    settings: BusSettings, since_ms: int, *, source: str, topics: Iterable[str] = (), timeout_s: float = 60.0
) -> list[DeadLetter]:
    """The letters `source` (a service's name) wrote from `since_ms` on, one per source record (the last
    kept), of `topics` only when given (catalog names such as llm.results, or full names)."""
    names = t.Topics(settings.topic_prefix)
    wanted = set(topics)
    letters = await read_since(settings, names.name(t.DLQ), DeadLetter, since_ms, timeout_s)
    chosen: dict[Where, DeadLetter] = {}
    for letter in letters:
        if letter.service != source:
            continue
        if wanted and not {letter.source_topic, catalog_name(names, letter.source_topic)} & wanted:
            continue
        chosen[where(letter)] = letter
    return list(chosen.values())


async def originals(settings: BusSettings, letters: list[DeadLetter], timeout_s: float) -> dict[Where, ConsumerRecord]:
    """The records the letters name, read from their topics (those no longer there are absent)."""
    wanted: dict[TopicPartition, set[int]] = defaultdict(set)
    for letter in letters:
        wanted[TopicPartition(letter.source_topic, letter.source_partition)].add(letter.source_offset)
    found: dict[Where, ConsumerRecord] = {}
    if not wanted:
        return found
    consumer = reader(settings)
    try:
        await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
        consumer.assign(list(wanted))
        starts = await asyncio.wait_for(consumer.beginning_offsets(list(wanted)), settings.admin_timeout_s)
        for tp, offsets in wanted.items():
            for offset in sorted(o for o in offsets if o >= starts[tp]):
                consumer.seek(tp, offset)
                record = await asyncio.wait_for(consumer.getone(tp), timeout_s)
                if record.offset == offset:  # a compacted topic may have dropped it: the next one is not it
                    found[(tp.topic, tp.partition, offset)] = record
    finally:
        await asyncio.wait_for(consumer.stop(), settings.stop_timeout_s)
    return found


async def replay(settings: BusSettings, letters: list[DeadLetter], timeout_s: float = 60.0) -> ReplayReport:
    """Write each letter's record to its source topic and partition again (with REPLAYED_FROM), each
    acknowledged before the next, in the order of their offsets."""
    report = ReplayReport()
    records = await originals(settings, letters, timeout_s)
    producer = make_producer(settings, f"{settings.topic_prefix}llmbus-dlq-replay")
    await asyncio.wait_for(producer.start(), settings.admin_timeout_s)
    try:
        for letter in sorted(letters, key=where):
            origin = where(letter)
            record = records.get(origin)
            if record is not None:
                key, value, headers = record.key, record.value, list(record.headers)
            elif not letter.raw_truncated:
                key = base64.b64decode(letter.raw_key_b64) if letter.raw_key_b64 is not None else None
                value, headers = base64.b64decode(letter.raw_value_b64), []
                report.from_letter.append(origin)
            else:
                report.gone.append(origin)
                continue
            headers = [(k, v) for k, v in headers if k != REPLAYED_FROM]
            headers.append((REPLAYED_FROM, f"{origin[0]}/{origin[1]}/{origin[2]}".encode()))
            sent = await asyncio.wait_for(
                producer.send(letter.source_topic, value, key=key, headers=headers, partition=letter.source_partition),
                settings.send_timeout_s,
            )
            await asyncio.wait_for(sent, settings.send_timeout_s)
            report.replayed.append(origin)
    finally:
        await asyncio.wait_for(producer.stop(), settings.stop_timeout_s)
    return report
