"""Kubernetes actuator: a pool is a StatefulSet or a Deployment; scaling sets its replicas (the scale subresource).

Uses the official `kubernetes` client (in-cluster config, else ~/.kube/config, or an explicit
host for tests). Scale-down is the workload's own (a StatefulSet removes its highest ordinals
first): pods get SIGTERM and terminationGracePeriodSeconds to drain (deploy/k8s/ sets it above
the worker's drain grace).
"""

from __future__ import annotations

import asyncio
from typing import Any

from llmbus_services.autoscaler.core.config import KubernetesSpec


def make_api(host: str | None = None) -> Any:
    from kubernetes import client, config

    if host is not None:
        configuration = client.Configuration()
        configuration.host = host
        return client.AppsV1Api(client.ApiClient(configuration))
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.AppsV1Api()


class KubernetesActuator:
    name = "kubernetes"

    def __init__(self, pools: dict[str, KubernetesSpec], api: Any | None = None, host: str | None = None) -> None:
        self.pools = pools
        self.api = api if api is not None else make_api(host)

    async def replicas(self, pool: str) -> int:
        spec = self.pools[pool]
        read = getattr(self.api, f"read_namespaced_{spec.kind}_scale")
        scale = await asyncio.to_thread(read, spec.name, spec.namespace)
        return int(scale.spec.replicas or 0)

    async def scale(self, pool: str, replicas: int) -> None:
        spec = self.pools[pool]
        body = {"spec": {"replicas": replicas}}
        patch = getattr(self.api, f"patch_namespaced_{spec.kind}_scale")
        await asyncio.to_thread(patch, spec.name, spec.namespace, body)

    async def close(self) -> None:
        await asyncio.to_thread(self.api.api_client.close)
