"""Scheduler wiring: placements restored, the fleet followed (no group), then routed requests and outcomes; timers."""

from __future__ import annotations

import asyncio
import logging

from llmbus.bus.service import ServiceRuntime
from llmbus.contract import contracts
from llmbus.settings import BusSettings
from llmbus.state.store import dispatch_markers, redis_client
from llmbus_services.scheduler.adapters.pool_stats import publish_pool_stats
from llmbus_services.scheduler.adapters.store import PlacementStore
from llmbus_services.scheduler.config import SchedulerSettings
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.scheduler import CoreConfig, SchedulerCore
from llmbus_services.scheduler.flows import SchedulerHandlers

log = logging.getLogger(__name__)


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


def build(runtime: ServiceRuntime, sched: SchedulerSettings) -> SchedulerHandlers:
    """The scheduler's flows bound to its declared subscriptions (llmbus.contract.contracts.SCHEDULER)."""
    settings = runtime.settings
    redis = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
    runtime.on_stop(redis.aclose)
    store = PlacementStore(redis, f"{settings.topic_prefix}scheduler", sched.instance_id, ttl_s=sched.placement_ttl_s)
    fence = dispatch_markers(redis, settings.topic_prefix, settings.final_marker_ttl_s)
    handlers = SchedulerHandlers(runtime.bus, sched, build_core(sched), store, fence)
    handlers.replayed = runtime.replayed  # a heartbeat written before this start is not a fresh one

    async def restore() -> None:
        restored = await handlers.restore()
        log.info("scheduler %s: pipeline %s, %d placements restored", sched.instance_id, sched.pipeline, restored)

    runtime.on_start(restore)
    for fleet in ("workers", "nodes", "models", "control"):  # followed: one consumer, no group
        runtime.subscribe(fleet, handlers.on_fleet, retries=False)
    # What still waits for a revoked partition is handed over; a failed record gets its final error.
    runtime.subscribe(
        "routed",
        handlers.on_routed,
        on_error=handlers.on_routed_error,
        on_revoke=handlers.hand_over,
        retries=False,
        max_in_flight=sched.max_in_flight,
    )
    # Every instance reads every outcome (its own group): the placement may be another instance's,
    # and whoever sees the outcome first releases it in Redis.
    runtime.subscribe("outcomes", handlers.on_outcome, names={"instance": sched.instance_id}, retries=False)
    runtime.every(sched.tick_ms / 1000, "scheduler timer", handlers.tick)
    stats = handlers.pool_stats, handlers.core, sched.pool_stats_interval_s
    runtime.task("pool stats", lambda stop: publish_pool_stats(runtime.bus, *stats, stop))
    return handlers


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    runtime = await ServiceRuntime.connect(settings, contracts.SCHEDULER)
    build(runtime, SchedulerSettings())
    await runtime.run(stop)
