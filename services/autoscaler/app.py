"""Autoscaler wiring: two declared subscriptions (heartbeats, pool statistics), decisions out, an actuator."""

from __future__ import annotations

import asyncio
import logging

from llmbus.bus.service import ServiceRuntime
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import ScaleDecision
from llmbus.settings import BusSettings
from llmbus_services.autoscaler.adapters.actuators import Actuator, build_actuator
from llmbus_services.autoscaler.config import AutoscalerSettings
from llmbus_services.autoscaler.core import FleetTable
from llmbus_services.autoscaler.core.config import PoolsFile
from llmbus_services.autoscaler.core.merge import PoolStatsMerger
from llmbus_services.autoscaler.flows import AutoscalerHandlers

log = logging.getLogger(__name__)


def build_app(runtime: ServiceRuntime, cfg: AutoscalerSettings, actuator: Actuator | None = None) -> AutoscalerHandlers:
    """The handlers, bound to the autoscaler's declared subscriptions (llmbus.contract.contracts.AUTOSCALER)."""
    pools = PoolsFile.load(cfg.pools)
    scaling_topic = runtime.topics.name(t.SCALING)

    async def publish(decision: ScaleDecision) -> None:
        await runtime.publisher.publish(scaling_topic, decision, key=decision.pool)

    handlers = AutoscalerHandlers(
        pools,
        actuator or build_actuator(cfg, pools, runtime.settings),
        publish,
        FleetTable(stale_ms=int(cfg.worker_stale_s * 1000)),
        PoolStatsMerger(stale_s=cfg.stats_instance_stale_s, max_wait_s=cfg.stats_max_wait_s),
        stats_max_age_s=cfg.stats_max_age_s,
    )
    # Heartbeats: the compacted table from its start, no group (every instance needs all of it).
    runtime.subscribe("workers", handlers.on_worker)
    # Statistics: only fresh ones matter; a group so a restart resumes where it stopped.
    runtime.subscribe("pool_stats", handlers.on_pool_stats)

    async def reconcile() -> None:
        """Before any evaluation: its own decision log (keyed by pool), to finish the last decision of each."""
        await handlers.reconcile(await runtime.read_table("scaling"), max_age_s=cfg.resume_max_age_s)

    runtime.on_start(reconcile)
    runtime.on_stop(handlers.actuator.close)
    log.info("autoscaler: pools %s, actuator %s", sorted(handlers.pools), handlers.actuator.name)
    return handlers


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    await ServiceRuntime.serve(
        settings, contracts.AUTOSCALER, lambda runtime: build_app(runtime, AutoscalerSettings()), stop
    )
