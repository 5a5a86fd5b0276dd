"""The kubernetes actuator's contract, against a local stand-in of the API server's scale subresource.

No cluster can run here: the stand-in answers what the apps/v1 API answers for
GET/PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale (an autoscaling/v1 Scale), and
records what the official client sent (method, path, content type, body).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("kubernetes")

from kubernetes.client.exceptions import ApiException

from llmbus.bus.memory import MemoryBus
from llmbus.bus.service import transient
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import PoolStats, ScaleDecision, now_ms
from llmbus.settings import BusSettings
from llmbus_services.autoscaler.adapters.actuators.kubernetes import KubernetesActuator
from llmbus_services.autoscaler.app import build_app
from llmbus_services.autoscaler.config import AutoscalerSettings
from llmbus_services.autoscaler.core.config import KubernetesSpec

SCALE_PATH = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/(deployments|statefulsets)/([^/]+)/scale$")


class FakeApiServer:
    def __init__(self) -> None:
        self.replicas: dict[tuple[str, str, str], int] = {
            ("llmbus", "deployments", "engine-worker-a"): 2,
            ("llmbus", "statefulsets", "engine-worker-s"): 3,
        }
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return

            def _scale(self, ns: str, kind: str, name: str) -> None:
                n = fake.replicas[(ns, kind, name)]
                body = {
                    "apiVersion": "autoscaling/v1",
                    "kind": "Scale",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"replicas": n},
                    "status": {"replicas": n},
                }
                self._send(200, body)

            def _send(self, code: int, body: dict) -> None:
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _route(self) -> tuple[str, str, str] | None:
                m = SCALE_PATH.match(self.path.split("?")[0])
                if m is None or (m.group(1), m.group(2), m.group(3)) not in fake.replicas:
                    self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                                     "reason": "NotFound", "message": "deployments.apps not found"})  # fmt: skip
                    return None
                return m.group(1), m.group(2), m.group(3)

            def do_GET(self) -> None:
                fake.requests.append({"method": "GET", "path": self.path})
                if (key := self._route()) is not None:
                    self._scale(*key)

            def do_PATCH(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(
                    {"method": "PATCH", "path": self.path, "type": self.headers["Content-Type"], "body": body}
                )
                if (key := self._route()) is not None:
                    fake.replicas[key] = int(body["spec"]["replicas"])
                    self._scale(*key)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    yield server
    server.close()


async def test_reads_and_sets_replicas_through_the_scale_subresource(api_server: FakeApiServer) -> None:
    actuator = KubernetesActuator(
        {"pool-a": KubernetesSpec(namespace="llmbus", deployment="engine-worker-a")}, host=api_server.host
    )
    try:
        assert await actuator.replicas("pool-a") == 2
        await actuator.scale("pool-a", 5)
        assert await actuator.replicas("pool-a") == 5
        await actuator.scale("pool-a", 0)  # to zero
        assert api_server.replicas[("llmbus", "deployments", "engine-worker-a")] == 0
    finally:
        await actuator.close()
    gets = [r for r in api_server.requests if r["method"] == "GET"]
    patches = [r for r in api_server.requests if r["method"] == "PATCH"]
    assert all(r["path"].startswith("/apis/apps/v1/namespaces/llmbus/deployments/engine-worker-a/scale") for r in gets)
    assert [p["body"] for p in patches] == [{"spec": {"replicas": 5}}, {"spec": {"replicas": 0}}]
    # a merge-style patch of replicas only: nothing else of the Deployment is touched
    assert all(p["type"].split(";")[0] in ("application/merge-patch+json", "application/strategic-merge-patch+json")
               for p in patches)  # fmt: skip


async def test_a_statefulset_pool_scales_its_statefulset(api_server: FakeApiServer) -> None:
    actuator = KubernetesActuator(
        {"pool-s": KubernetesSpec(namespace="llmbus", statefulset="engine-worker-s")}, host=api_server.host
    )
    try:
        assert await actuator.replicas("pool-s") == 3
        await actuator.scale("pool-s", 1)
    finally:
        await actuator.close()
    assert api_server.replicas[("llmbus", "statefulsets", "engine-worker-s")] == 1
    assert {r["path"].split("?")[0] for r in api_server.requests} == {
        "/apis/apps/v1/namespaces/llmbus/statefulsets/engine-worker-s/scale"
    }


def test_a_pool_names_exactly_one_workload() -> None:
    for bad in ({}, {"deployment": "a", "statefulset": "b"}):
        with pytest.raises(ValueError, match="exactly one of deployment, statefulset"):
            KubernetesSpec(**bad)


async def test_a_missing_deployment_is_an_error_not_a_silent_zero(api_server: FakeApiServer) -> None:
    actuator = KubernetesActuator({"pool-b": KubernetesSpec(deployment="nope")}, host=api_server.host)
    try:
        with pytest.raises(ApiException) as err:
            await actuator.replicas("pool-b")
        assert err.value.status == 404
    finally:
        await actuator.close()


class StalledApiServer:
    """An API server that accepts connections and never answers (its etcd hangs, a proxy swallows it)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.host = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.held.append(conn)  # read nothing, answer nothing

    def close(self) -> None:
        self.listener.close()
        while self.held:
            self.held.pop().close()


@pytest.fixture
def stalled_api() -> Iterator[StalledApiServer]:
    server = StalledApiServer()
    yield server
    server.close()


def _waiting_stats(pool: str) -> PoolStats:
    now = now_ms()
    return PoolStats(pool=pool, window_start_ms=now - 5000, window_s=5.0, arrivals=1, queued=1, oldest_wait_ms=900)


async def test_a_stalled_api_server_times_out_the_call_and_frees_the_lock_so_scaling_goes_on(
    stalled_api: StalledApiServer, api_server: FakeApiServer
) -> None:
    """A call with no answer ends (a transient TimeoutError: the record is retried) within its timeouts,
    the handler's lock is free again, and once the server answers the next statistics scale the pool."""
    pool = "sim-llama-8b"
    api_server.replicas[("llmbus", "statefulsets", "engine-worker-sim-llama-8b")] = 0
    actuator = KubernetesActuator(
        {pool: KubernetesSpec(namespace="llmbus", statefulset="engine-worker-sim-llama-8b")}, host=stalled_api.host
    )
    actuator.connect_timeout_s, actuator.read_timeout_s = 0.5, 1.0
    bus = MemoryBus(BusSettings(topic_prefix="unit."))
    runtime = bus.runtime(contracts.AUTOSCALER, max_attempts=1)
    handlers = build_app(runtime, AutoscalerSettings(actuator="none"), actuator)
    try:
        started = time.monotonic()
        evaluation = asyncio.create_task(bus.send(bus.topics.name(t.POOL_STATS), _waiting_stats(pool)))
        done, _ = await asyncio.wait({evaluation}, timeout=15)
        assert evaluation in done, "the evaluation hangs on the stalled API server (and holds the lock)"
        elapsed_s = time.monotonic() - started
        error = evaluation.exception()
        assert isinstance(error, TimeoutError) and transient(error), error  # retried in place, never the DLQ
        assert elapsed_s < 5.0, f"{elapsed_s:.1f}s for a call bounded by 1.5s"
        assert not handlers._lock.locked()
        assert not bus.published(bus.topics.name(t.SCALING), ScaleDecision)

        # The API server answers again (here: another address): the next statistics scale the pool.
        actuator.api.api_client.configuration.host = api_server.host
        await bus.send(bus.topics.name(t.POOL_STATS), _waiting_stats(pool))
        (decision,) = bus.published(bus.topics.name(t.SCALING), ScaleDecision)
        assert (decision.current_replicas, decision.desired_replicas) == (0, 1)
        assert api_server.replicas[("llmbus", "statefulsets", "engine-worker-sim-llama-8b")] == 1
    finally:
        stalled_api.close()  # first: a call still waiting on it (a failed run) ends, and the client can close
        await actuator.close()


async def test_an_unreachable_api_server_is_a_transient_connection_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    actuator = KubernetesActuator(
        {"p": KubernetesSpec(deployment="d")}, host=f"http://127.0.0.1:{port}", connect_timeout_s=0.5
    )
    try:
        with pytest.raises(ConnectionError) as err:
            await actuator.replicas("p")
        assert transient(err.value)
    finally:
        await actuator.close()
