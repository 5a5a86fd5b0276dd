"""Actuators behind one Protocol (`Actuator`), by registry name (llmbus.contract.plugins): local processes,
a Kubernetes workload, or none (dry run). Each is imported only when chosen."""

from __future__ import annotations

from llmbus.contract.plugins import Registry
from llmbus.settings import BusSettings
from llmbus_services.autoscaler.adapters.actuators.base import Actuator, NoActuator
from llmbus_services.autoscaler.config import AutoscalerSettings
from llmbus_services.autoscaler.core.config import PoolsFile

ACTUATORS: Registry[Actuator] = Registry("actuator")


def build_actuator(cfg: AutoscalerSettings, pools: PoolsFile, settings: BusSettings) -> Actuator:
    """The actuator `cfg.actuator` names, for the pools of `pools`."""
    return ACTUATORS.build(cfg.actuator, cfg=cfg, pools=pools, settings=settings)


@ACTUATORS.register("local")
def local(cfg: AutoscalerSettings, pools: PoolsFile, settings: BusSettings) -> Actuator:
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


@ACTUATORS.register("kubernetes")
def kubernetes(cfg: AutoscalerSettings, pools: PoolsFile, settings: BusSettings) -> Actuator:
    from llmbus_services.autoscaler.adapters.actuators.kubernetes import KubernetesActuator

    k8s = {name: spec.kubernetes for name, spec in pools.pools.items() if spec.kubernetes is not None}
    if missing := set(pools.pools) - set(k8s):
        raise ValueError(f"pools without a `kubernetes:` section: {sorted(missing)}")
    return KubernetesActuator(
        k8s,
        host=cfg.kubernetes_host,
        connect_timeout_s=cfg.kubernetes_connect_timeout_s,
        read_timeout_s=cfg.kubernetes_read_timeout_s,
    )


@ACTUATORS.register("none")
def none(cfg: AutoscalerSettings, pools: PoolsFile, settings: BusSettings) -> Actuator:
    return NoActuator()


__all__ = ["ACTUATORS", "Actuator", "NoActuator", "build_actuator"]
