"""Catching up on compacted state topics (models, experiments, budgets) before routing."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer

from llmbus.bus import ConsumerLoop
from llmbus.bus.catch_up import assigned_ends, reached

log = logging.getLogger(__name__)


async def caught_up(consumer: AIOKafkaConsumer, loop: ConsumerLoop, timeout_s: float) -> bool:
    """True once `loop` has handled every record that was in the consumer's topics when this was called."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        ends = await assigned_ends(consumer, timeout_s)
    except TimeoutError:
        log.warning("state topics not assigned within %.1fs; routing anyway", timeout_s)
        return False
    while asyncio.get_running_loop().time() < deadline:
        # Records come out of getmany and become tasks in one step, so position + no tasks in flight
        # means everything up to the end offsets was applied.
        if await reached(consumer, ends, timeout_s) and loop.in_flight == 0:
            return True
        await asyncio.sleep(0.02)
    log.warning("state topics %s not caught up within %.1fs; routing anyway", sorted(t.topic for t in ends), timeout_s)
    return False
