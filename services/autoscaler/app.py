"""Autoscaler wiring: two declared subscriptions (heartbeats, pool statistics), decisions out, an actuator."""

from __future__ import annotations

import asyncio
import logging

from llmbus.bus.service import ServiceRuntime
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import ScaleDecision
from llmbus.settings import BusSettings
from llmbus_services.autoscaler.adapters.actuators import Actuator, NoActuator
from llmbus_services.autoscaler.config import AutoscalerSettings
from llmbus_services.autoscaler.core import FleetTable
from llmbus_services.autoscaler.core.config import PoolsFile
from llmbus_services.autoscaler.core.merge import PoolStatsMerger
from llmbus_services.autoscaler.handlers import AutoscalerHandlers

log = logging.getLogger(__name__)


def build_actuator(cfg: AutoscalerSettings, pools: PoolsFile, settings: BusSettings) -> Actuator:
    if cfg.actuator == "local":
        from llmbus_services.autoscaler.adapters.actuators.local import LocalActuator

        # The workers join this autoscaler's bus (and namespace).
        bus_env = {
            "LLMBUS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "LLMBUS_TOPIC_PREFIX": settings.topic_prefix,
            "LLMBUS_REDIS_URL": settings.redis_url,
        }
        return LocalActuator(
            {name: spec.local for name, spec in pools.pools.items()},
            bus_env | cfg.worker_env,
            cfg.worker_metrics_port_base,
        )
    if cfg.actuator == "kubernetes":
        from llmbus_services.autoscaler.adapters.actuators.kubernetes import KubernetesActuator

        k8s = {name: spec.kubernetes for name, spec in pools.pools.items() if spec.kubernetes is not None}
        if missing := set(pools.pools) - set(k8s):
            raise ValueError(f"pools without a `kubernetes:` section: {sorted(missing)}")
        return KubernetesActuator(k8s, host=cfg.kubernetes_host)
    return NoActuator()


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
    return handlers


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    runtime = await ServiceRuntime.connect(settings, contracts.AUTOSCALER)
    cfg = AutoscalerSettings()
    handlers = build_app(runtime, cfg)
    log.info("autoscaler: pools %s, actuator %s", sorted(handlers.pools), handlers.actuator.name)
    try:
        # Before any evaluation: its own decision log (keyed by pool), to finish the last decision of each.
        await handlers.reconcile(await runtime.read_table("scaling"), max_age_s=cfg.resume_max_age_s)
        await runtime.start()
        await runtime.wait(stop)
    finally:
        await runtime.stop()
        await handlers.actuator.close()
