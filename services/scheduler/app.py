"""Scheduler wiring: heartbeats (no group, from the start), routed requests and outcomes."""

from __future__ import annotations

import asyncio
import contextlib

from llmbus import topics as t
from llmbus.bus import Bus, ConsumerLoop, make_consumer, stop_consumer
from llmbus.settings import BusSettings
from llmbus.state import DedupeStore, redis_client
from services.scheduler.config import SchedulerSettings
from services.scheduler.handlers import SchedulerHandlers


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    sched = SchedulerSettings()
    bus = await Bus.start(settings, t.SCHEDULER)
    redis = redis_client(settings.redis_url)
    handlers = SchedulerHandlers(bus, sched, DedupeStore(redis, f"{settings.topic_prefix}scheduler"))
    topics = bus.topics

    workers = make_consumer(settings, topics.name(t.WORKERS), group_id=None, client_id="llmbus-scheduler-fleet")
    routed = make_consumer(settings, group_id=topics.group(t.SCHEDULER), client_id="llmbus-scheduler")
    outcomes = make_consumer(
        settings, group_id=topics.group(t.SCHEDULER, "outcomes"), client_id="llmbus-scheduler-outcomes"
    )
    loops = [
        ConsumerLoop(
            workers, handlers.on_worker_status, bus.dead_letter, settings, service=t.SCHEDULER, commit_offsets=False
        ),
        ConsumerLoop(
            routed,
            handlers.on_routed,
            bus.dead_letter,
            settings,
            service=t.SCHEDULER,
            max_in_flight=sched.max_in_flight,
        ),
        ConsumerLoop(outcomes, handlers.on_outcome, bus.dead_letter, settings, service=t.SCHEDULER, max_in_flight=256),
    ]
    routed.subscribe([topics.name(t.ROUTED)], listener=loops[1].rebalance_listener())
    outcomes.subscribe([topics.name(t.OUTCOMES)], listener=loops[2].rebalance_listener())
    for consumer in (workers, routed, outcomes):
        await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
    try:
        # The fleet view first: no placement before the heartbeats already in the log are read.
        tasks = [asyncio.create_task(loop.run(stop)) for loop in loops]
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                stop.set()
        await asyncio.gather(*tasks)
    finally:
        for consumer in (workers, routed, outcomes):
            await stop_consumer(consumer, settings.stop_timeout_s)
        with contextlib.suppress(Exception):
            await redis.aclose()
        await bus.stop()
