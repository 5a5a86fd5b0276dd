"""Autoscaler wiring: a FastStream Kafka broker, two typed subscribers, one publisher, an actuator."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from faststream import FastStream
from faststream.kafka import KafkaBroker

from llmbus import topics as t
from llmbus.bus import headers as hdr
from llmbus.bus.security import faststream_security
from llmbus.messages import PoolStats, ScaleDecision, WorkerStatus
from llmbus.settings import BusSettings
from services.autoscaler.actuators import Actuator, NoActuator
from services.autoscaler.config import AutoscalerSettings
from services.autoscaler.handlers import AutoscalerHandlers
from services.autoscaler.policy import FleetTable
from services.autoscaler.policy.config import PoolsFile
from services.autoscaler.policy.merge import PoolStatsMerger

log = logging.getLogger(__name__)


def build_actuator(cfg: AutoscalerSettings, pools: PoolsFile, settings: BusSettings) -> Actuator:
    if cfg.actuator == "local":
        from services.autoscaler.actuators.local import LocalActuator

        # The workers join this autoscaler's bus (and namespace).
        bus_env = {
            "LLMBUS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "LLMBUS_TOPIC_PREFIX": settings.topic_prefix,
            "LLMBUS_REDIS_URL": settings.redis_url,
        }
        return LocalActuator(
            {name: spec.local for name, spec in pools.pools.items()}, bus_env, cfg.worker_metrics_port_base
        )
    if cfg.actuator == "kubernetes":
        from services.autoscaler.actuators.kubernetes import KubernetesActuator

        k8s = {name: spec.kubernetes for name, spec in pools.pools.items() if spec.kubernetes is not None}
        if missing := set(pools.pools) - set(k8s):
            raise ValueError(f"pools without a `kubernetes:` section: {sorted(missing)}")
        return KubernetesActuator(k8s, host=cfg.kubernetes_host)
    return NoActuator()


def build_app(
    settings: BusSettings, cfg: AutoscalerSettings, actuator: Actuator | None = None
) -> tuple[FastStream, KafkaBroker, AutoscalerHandlers]:
    pools = PoolsFile.load(cfg.pools)
    topics = t.Topics(settings.topic_prefix)
    broker = KafkaBroker(
        settings.kafka_bootstrap,
        client_id="llmbus-autoscaler",
        security=faststream_security(settings),
        acks="all",
        enable_idempotence=True,
        request_timeout_ms=settings.request_timeout_ms,
        log_level=logging.DEBUG,  # one line per heartbeat read would drown the decisions
    )
    scaling_topic = topics.name(t.SCALING)

    async def publish(decision: ScaleDecision) -> None:
        headers = {k: v.decode() for k, v in hdr.outgoing(decision, t.AUTOSCALER)}
        await asyncio.wait_for(
            broker.publish(decision.to_bytes(), scaling_topic, key=decision.pool.encode(), headers=headers),
            settings.send_timeout_s,
        )

    handlers = AutoscalerHandlers(
        pools,
        actuator or build_actuator(cfg, pools, settings),
        publish,
        FleetTable(stale_ms=int(cfg.worker_stale_s * 1000)),
        PoolStatsMerger(stale_s=cfg.stats_instance_stale_s, max_wait_s=cfg.stats_max_wait_s),
    )

    # Heartbeats: the compacted table from its start, no group (every instance needs all of it).
    @broker.subscriber(topics.name(t.WORKERS), auto_offset_reset="earliest", title="workers")
    async def on_worker(status: WorkerStatus) -> None:
        await handlers.on_worker(status)

    # Statistics: only fresh ones matter; a group so a restart resumes where it stopped.
    @broker.subscriber(
        topics.name(t.POOL_STATS), group_id=topics.group(t.AUTOSCALER), auto_offset_reset="latest", title="pool-stats"
    )
    async def on_pool_stats(stats: PoolStats) -> None:
        await handlers.on_pool_stats(stats)

    broker.publisher(scaling_topic, title="scaling", schema=ScaleDecision)  # in the AsyncAPI document
    return FastStream(broker), broker, handlers


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    cfg = AutoscalerSettings()
    _, broker, handlers = build_app(settings, cfg)
    await asyncio.wait_for(broker.start(), settings.admin_timeout_s)
    log.info("autoscaler: pools %s, actuator %s", sorted(handlers.pools), handlers.actuator.name)
    try:
        await handlers.reconcile()
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(broker.stop(), settings.stop_timeout_s)
        await handlers.actuator.close()
