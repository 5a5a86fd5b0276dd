"""Scheduler wiring: fleet topics (no group, from the start), routed requests, outcomes, a timer."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from llmbus.bus import Bus, ConsumerLoop, make_consumer, stop_consumer
from llmbus.bus.catch_up import assigned_ends
from llmbus.bus.runtime import run_until_stopped
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.settings import BusSettings
from llmbus.state.store import dispatch_markers, redis_client
from llmbus_services.scheduler.adapters.pool_stats import publish_pool_stats
from llmbus_services.scheduler.adapters.store import PlacementStore
from llmbus_services.scheduler.config import SchedulerSettings
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.scheduler import CoreConfig, SchedulerCore
from llmbus_services.scheduler.handlers import SchedulerHandlers

log = logging.getLogger(__name__)
OUTCOMES_IN_FLIGHT = 256
# Fleet records (heartbeats above all) are taken as they arrive, each then waiting its turn for the
# handlers' lock. One at a time, llm.workers was read only as fast as that lock came round: behind
# hundreds of outcome and routed handlers after a leader failover (the 3-broker `leader_sigkill`
# scenario at load 16-22), its lag grew to 128 heartbeats, a live worker went unheard past its
# heartbeat timeout, and its 256 running requests were placed again. The lock is FIFO and a
# heartbeat's handler awaits nothing before it, so one worker's statuses still apply in order.
FLEET_IN_FLIGHT = 64


def build_core(sched: SchedulerSettings) -> SchedulerCore:
    return SchedulerCore(
        Pipeline.load(sched.pipeline),
        CoreConfig(
            max_attempts=sched.max_attempts,
            heartbeat_timeout_ms=int(sched.heartbeat_stale_s * 1000),
            max_queued_per_model=sched.max_queued_per_model,
            max_queued_per_tenant=sched.max_queued_per_tenant,
            max_wait_ms=int(sched.no_worker_timeout_s * 1000),
            prefix_block_tokens=sched.prefix_block_tokens,
            prefill_tokens_per_s=sched.prefill_tokens_per_s,
            seed=sched.seed,
        ),
    )


class HandOverListener(ConsumerRebalanceListener):
    """The routed loop's own listener, after handing over what waits for the revoked partitions."""

    def __init__(self, inner: ConsumerRebalanceListener, handlers: SchedulerHandlers) -> None:
        self.inner = inner
        self.handlers = handlers

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.handlers.hand_over(set(revoked))
        await asyncio.sleep(0)  # the cancelled handlers end (uncommitted) before the loop commits
        await self.inner.on_partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.inner.on_partitions_assigned(assigned)


async def end_offsets(consumer: AIOKafkaConsumer, topic: str, timeout_s: float) -> dict[int, int]:
    """Partition → end offset now: records below it were written before this process started."""
    ends = await assigned_ends(consumer, timeout_s)
    return {tp.partition: offset for tp, offset in ends.items() if tp.topic == topic}


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    sched = SchedulerSettings()
    bus = await Bus.start(settings, t.SCHEDULER)
    redis = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
    store = PlacementStore(redis, f"{settings.topic_prefix}scheduler", sched.instance_id, ttl_s=sched.placement_ttl_s)
    fence = dispatch_markers(redis, settings.topic_prefix, settings.final_marker_ttl_s)
    handlers = SchedulerHandlers(bus, sched, build_core(sched), store, fence)
    restored = await handlers.restore()
    log.info("scheduler %s: pipeline %s, %d placements restored", sched.instance_id, sched.pipeline, restored)
    topics = bus.topics

    fleet = make_consumer(
        settings,
        topics.name(t.WORKERS),
        topics.name(t.NODES),
        topics.name(t.MODELS),
        topics.name(t.CONTROL),
        group_id=None,
        client_id="llmbus-scheduler-fleet",
    )
    routed = make_consumer(
        settings, group_id=contracts.SCHEDULER.group_id("routed", topics), client_id="llmbus-scheduler"
    )
    # Every instance reads every outcome (its own group): the placement may be another instance's,
    # and whoever sees the outcome first releases it in Redis.
    outcomes = make_consumer(
        settings,
        group_id=contracts.SCHEDULER.group_id("outcomes", topics, instance=sched.instance_id),
        client_id="llmbus-scheduler-outcomes",
    )
    loops = [
        ConsumerLoop(
            fleet,
            handlers.on_fleet,
            bus.dead_letter,
            settings,
            service=t.SCHEDULER,
            commit_offsets=False,
            max_in_flight=FLEET_IN_FLIGHT,
        ),
        ConsumerLoop(
            routed,
            handlers.on_routed,
            handlers.on_routed_error,
            settings,
            service=t.SCHEDULER,
            max_in_flight=sched.max_in_flight,
        ),
        # Outcomes are handled concurrently: their claims' releases share Redis round trips, and the
        # core sees them one at a time under the handlers' lock in any order (it holds one placement
        # per request and ignores an outcome of any other attempt; a release is of that attempt's key).
        ConsumerLoop(
            outcomes,
            handlers.on_outcome,
            bus.dead_letter,
            settings,
            service=t.SCHEDULER,
            max_in_flight=OUTCOMES_IN_FLIGHT,
        ),
    ]
    routed.subscribe([topics.name(t.ROUTED)], listener=HandOverListener(loops[1].rebalance_listener(), handlers))
    outcomes.subscribe([topics.name(t.OUTCOMES)], listener=loops[2].rebalance_listener())
    for consumer in (fleet, routed, outcomes):
        await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
    handlers.fleet_replay_end = await end_offsets(fleet, topics.name(t.WORKERS), settings.admin_timeout_s)
    try:
        tasks = [asyncio.create_task(loop.run(stop)) for loop in loops]
        tasks.append(asyncio.create_task(handlers.run_timer(stop)))
        tasks.append(
            asyncio.create_task(
                publish_pool_stats(bus, handlers.pool_stats, handlers.core, sched.pool_stats_interval_s, stop)
            )
        )
        await run_until_stopped(tasks, stop)
    finally:
        for consumer in (fleet, routed, outcomes):
            await stop_consumer(consumer, settings.stop_timeout_s)
        with contextlib.suppress(Exception):
            await redis.aclose()
        await bus.stop()
