"""Catching up on compacted state topics (models, experiments, budgets) before routing."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer

from llmbus.bus import ConsumerLoop

log = logging.getLogger(__name__)


async def caught_up(consumer: AIOKafkaConsumer, loop: ConsumerLoop, timeout_s: float) -> bool:
    """True once `loop` has handled every record that was in the consumer's topics when this was called."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (tps := consumer.assignment()):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.05)
    ends = await asyncio.wait_for(consumer.end_offsets(list(tps)), timeout_s)
    while asyncio.get_running_loop().time() < deadline:
        positions = [await consumer.position(tp) for tp in tps]
        # Records come out of getmany and become tasks in one step, so position + no tasks in flight
        # means everything up to the end offsets was applied.
        if all(pos >= ends[tp] for tp, pos in zip(tps, positions, strict=True)) and loop.in_flight == 0:
            return True
        await asyncio.sleep(0.02)
    log.warning("state topics %s not caught up within %.1fs; routing anyway", sorted(t.topic for t in tps), timeout_s)
    return False
