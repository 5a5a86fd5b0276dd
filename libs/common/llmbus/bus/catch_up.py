"""Reading a topic up to where it ended when we looked: wait for partitions, take end offsets, read.

Every wait and broker call here is bounded: `start()` of an aiokafka consumer returns before its
group join (or, without a group, before the topic's metadata arrives), and a loaded broker answers
late, so a loop with no deadline can hang a service's start for ever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

log = logging.getLogger(__name__)


class NotReadToEnd(TimeoutError):
    """The deadline passed with partitions still short of their end offsets."""

    def __init__(self, pending: set[TopicPartition], timeout_s: float) -> None:
        super().__init__(f"{len(pending)} partitions not read to their end within {timeout_s:.0f}s")
        self.pending = pending


async def wait_assigned(consumer: AIOKafkaConsumer, timeout_s: float) -> list[TopicPartition]:
    """The consumer's partitions, once it has them and their start positions are fixed.

    `start()` returns before the group join: a consumer that starts at the log end
    (auto_offset_reset=latest) would skip what is published in between. After this, nothing is.
    Raises TimeoutError when no partition came within `timeout_s`.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not (tps := sorted(consumer.assignment())):
        if loop.time() > deadline:
            raise TimeoutError(f"no partitions assigned within {timeout_s}s")
        await asyncio.sleep(0.05)
    for tp in tps:
        await asyncio.wait_for(consumer.position(tp), max(0.1, deadline - loop.time()))
    return tps


async def assigned_ends(consumer: AIOKafkaConsumer, timeout_s: float) -> dict[TopicPartition, int]:
    """End offset of each assigned partition now (after `wait_assigned`): records below it exist already."""
    tps = await wait_assigned(consumer, timeout_s)
    return await asyncio.wait_for(consumer.end_offsets(tps), timeout_s)


async def reached(consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int], timeout_s: float) -> bool:
    """True when the consumer's position on every partition of `ends` is at or past its end offset."""
    for tp, end in ends.items():
        if await asyncio.wait_for(consumer.position(tp), timeout_s) < end:
            return False
    return True


async def caught_up(
    consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int], in_flight: Callable[[], int], timeout_s: float
) -> bool:
    """True once the consumer's loop has handled every record below `ends`; False when `timeout_s` ran out.

    Records come out of getmany and become tasks in one step, so position at the end and nothing in
    flight means everything up to the end offsets was applied."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await reached(consumer, ends, timeout_s) and in_flight() == 0:
            return True
        await asyncio.sleep(0.02)
    return False


async def read_to_end(
    consumer: AIOKafkaConsumer,
    ends: dict[TopicPartition, int],
    timeout_s: float,
    *,
    call_timeout_s: float,
    max_records: int | None = None,
) -> AsyncGenerator[ConsumerRecord, None]:
    """Every record from the consumer's positions up to `ends` (exclusive), partition by partition in order.

    A partition is done when its position reaches its end, not when a record at end - 1 arrives:
    transaction markers and compaction leave offsets that never come back as records.
    Raises NotReadToEnd when `timeout_s` passes first; `call_timeout_s` bounds each broker call.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pending = {tp for tp, end in ends.items() if end > 0}
    while pending:
        for tp in sorted(pending):
            if await asyncio.wait_for(consumer.position(tp), call_timeout_s) >= ends[tp]:
                pending.discard(tp)
        if not pending:
            return
        if loop.time() > deadline:
            raise NotReadToEnd(pending, timeout_s)
        batches = await consumer.getmany(*pending, timeout_ms=200, max_records=max_records)
        for tp, records in batches.items():
            for record in records:
                if record.offset < ends[tp]:
                    yield record


async def first_records(
    consumer: AIOKafkaConsumer,
    starts: dict[TopicPartition, int],
    ends: dict[TopicPartition, int],
    timeout_s: float,
    *,
    call_timeout_s: float,
) -> dict[TopicPartition, ConsumerRecord]:
    """The first record at or after each partition's start offset and below its end (an assigned
    consumer; it is moved to `starts`). A partition with only markers or compacted offsets left there
    has none. Raises NotReadToEnd when `timeout_s` (for all of them) passes first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    firsts: dict[TopicPartition, ConsumerRecord] = {}
    for tp, start in sorted(starts.items()):
        if start >= ends[tp]:
            continue
        consumer.seek(tp, start)
        records = read_to_end(
            consumer, {tp: ends[tp]}, max(0.0, deadline - loop.time()), call_timeout_s=call_timeout_s, max_records=1
        )
        try:
            async for record in records:
                firsts[tp] = record
                break
        finally:
            await records.aclose()
    return firsts
