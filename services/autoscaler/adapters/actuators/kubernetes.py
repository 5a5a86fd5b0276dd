"""Kubernetes actuator: a pool is a StatefulSet or a Deployment; scaling sets its replicas (the scale subresource).

Uses the official `kubernetes` client (in-cluster config, else ~/.kube/config, or an explicit
host for tests). Scale-down is the workload's own (a StatefulSet removes its highest ordinals
first): pods get SIGTERM and terminationGracePeriodSeconds to drain. The worker hands its answers
over mid-stream after LLMBUS_WORKER_HANDOVER_GRACE_S and lets the rest finish for
LLMBUS_WORKER_DRAIN_GRACE_S; deploy/k8s/ sets both below terminationGracePeriodSeconds (checked by
tests/unit/test_k8s_manifests.py), so nothing is cut by the kubelet's SIGKILL.

Every API call is bounded: a connect and a read timeout on the request itself (urllib3's
`_request_timeout`, one try: the service runtime retries the handler with backoff), and the same
bound around the thread that makes it. The autoscaler evaluates a pool and acts on it under one
lock, so an API server that accepts connections and never answers would otherwise hold that lock,
and with it every pool's scaling, for good. A call that runs out of time raises
`ActuatorTimeout` (a TimeoutError: transient, the record is retried), one that cannot reach the
server `ActuatorUnavailable` (a ConnectionError: transient too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from llmbus_services.autoscaler.core.config import KubernetesSpec

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 10.0


class ActuatorTimeout(TimeoutError):
    """The Kubernetes API did not answer within the call's timeouts."""


class ActuatorUnavailable(ConnectionError):
    """The Kubernetes API could not be reached (refused, reset, a broken answer)."""


def make_api(host: str | None = None) -> Any:
    from kubernetes import client, config

    if host is not None:
        configuration = client.Configuration()
        configuration.host = host
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        configuration = client.Configuration.get_default_copy()
    configuration.retries = 0  # one try per call: the handler is retried, with backoff, by the runtime
    return client.AppsV1Api(client.ApiClient(configuration))


class KubernetesActuator:
    name = "kubernetes"

    def __init__(
        self,
        pools: dict[str, KubernetesSpec],
        api: Any | None = None,
        host: str | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.pools = pools
        self.api = api if api is not None else make_api(host)
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s

    async def replicas(self, pool: str) -> int:
        spec = self.pools[pool]
        scale = await self._call(getattr(self.api, f"read_namespaced_{spec.kind}_scale"), spec.name, spec.namespace)
        return int(scale.spec.replicas or 0)

    async def scale(self, pool: str, replicas: int) -> None:
        spec = self.pools[pool]
        body = {"spec": {"replicas": replicas}}
        await self._call(getattr(self.api, f"patch_namespaced_{spec.kind}_scale"), spec.name, spec.namespace, body)

    async def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        """`method(*args)` in a thread, bounded by the request's timeouts (and, should the client
        ignore them, by their sum around the thread: the thread itself ends with its request)."""
        from urllib3.exceptions import HTTPError, MaxRetryError, NewConnectionError
        from urllib3.exceptions import TimeoutError as Urllib3Timeout

        bound_s = self.connect_timeout_s + self.read_timeout_s
        what = f"{getattr(method, '__name__', 'kubernetes call')}{args[:2]}"
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(method, *args, _request_timeout=(self.connect_timeout_s, self.read_timeout_s)),
                bound_s + 1.0,
            )
        except TimeoutError as exc:
            raise ActuatorTimeout(f"{what}: no answer within {bound_s:.1f}s") from exc
        except HTTPError as exc:
            cause = exc.reason if isinstance(exc, MaxRetryError) else exc
            # (urllib3's NewConnectionError, a refused connection, is a subclass of its timeouts)
            if isinstance(cause, Urllib3Timeout) and not isinstance(cause, NewConnectionError):
                raise ActuatorTimeout(f"{what}: {cause}") from exc
            raise ActuatorUnavailable(f"{what}: {cause}") from exc

    async def close(self) -> None:
        await asyncio.to_thread(self.api.api_client.close)
