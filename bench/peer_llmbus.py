"""The llmbus path of the peer benchmark: gateway → router → scheduler → one openai-http worker → the upstream.

Services run as the tests and benches run them (llmbus_tools.harness.service_procs.ServiceProc, one
process each), from any checkout (`tree`: this one, or a baseline's, through
llmbus.process.launch.checkout_pythonpath), in a fresh topic namespace. The broker and Redis are
either private ones started for the run (deploy/kafka/kafka.sh and deploy/redis/redis.sh on free
ports: their CPU is then llmbus's alone) or the machine's shared ones (their CPU then includes
everyone else's work). The gateway checks an API key per request, as deployed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench.peer_load import chat_body
from bench.peer_targets import UPSTREAM_MODEL, Target, wait_http
from bench.pipeline_bench import TENANT, bench_policy
from bench.pipeline_load import broker_pid
from llmbus.bus.admin import ensure_catalog
from llmbus.process.launch import checkout_pythonpath
from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.reliability.infra import PrivateKafka, PrivateRedis
from llmbus_tools.harness.service_procs import ServiceProc, drop_namespace, fresh_settings, wait_workers_ready

WORKER_ID = "peer-w1"
# A broker measured at steady state: both JIT compilers and G1, as `make up` runs it (not the tests' quick flags).
BROKER_JVM_FLAGS = "-Xms256m -Xmx768m -XX:+UseG1GC"


@dataclass
class Infra:
    """Where the llmbus stacks' broker and Redis are, and their processes."""

    kafka_bootstrap: str
    redis_url: str
    roles: dict[str, int]
    versions: dict[str, str] = field(default_factory=dict)
    private: bool = True


def _infra_versions(broker: int | None, redis_url: str) -> dict[str, str]:
    versions: dict[str, str] = {}
    if broker is not None:
        classpath = " ".join(psutil.Process(broker).cmdline())
        if found := re.search(r"kafka-([0-9.]+)/libs", classpath):  # deploy/kafka/kafka.sh's cache layout
            versions["kafka"] = found.group(1)
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
    if found := re.search(r'version "([^"]+)"', java.stderr):
        versions["java"] = found.group(1)
    info = subprocess.run(
        ["redis-cli", "-u", redis_url, "INFO", "server"], capture_output=True, text=True, timeout=30
    ).stdout
    if found := re.search(r"redis_version:(\S+)", info):
        versions["redis-server"] = found.group(1)
    return versions


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


@contextlib.asynccontextmanager
async def private_infra(work: Path) -> AsyncIterator[Infra]:
    """A broker and a Redis (append-only file on, as deployed) of the run's own, stopped at the end."""
    kafka = PrivateKafka(work / "kafka", jvm_flags=BROKER_JVM_FLAGS)
    redis = PrivateRedis(work / "redis")
    try:
        kafka.start()
        redis.start()
        pids = {"broker": broker_pid(kafka.bootstrap), "redis": broker_pid(f"127.0.0.1:{redis.port}")}
        roles = {name: pid for name, pid in pids.items() if pid is not None}
        yield Infra(kafka.bootstrap, redis.url, roles, _infra_versions(pids["broker"], redis.url))
    finally:
        with contextlib.suppress(Exception):
            redis.stop()
        with contextlib.suppress(Exception):
            kafka.stop()


@contextlib.asynccontextmanager
async def shared_infra() -> AsyncIterator[Infra]:
    """The machine's broker and Redis (LLMBUS_KAFKA_BOOTSTRAP, LLMBUS_REDIS_URL): shared with whoever else uses them."""
    settings = BusSettings()
    pids = {
        "broker": broker_pid(settings.kafka_bootstrap),
        "redis": broker_pid(f"127.0.0.1:{_port_of(settings.redis_url)}"),
    }
    roles = {name: pid for name, pid in pids.items() if pid is not None}
    yield Infra(
        settings.kafka_bootstrap, settings.redis_url, roles, _infra_versions(pids["broker"], settings.redis_url), False
    )


def tree_version(tree: Path) -> str:
    """`<short sha>` of a checkout, `+changes` when its work tree differs from it."""
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True, timeout=30)
    if sha.returncode != 0:
        return "not a git checkout"
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=tree, capture_output=True, text=True, timeout=30)
    return sha.stdout.strip() + (" +changes" if dirty.stdout.strip() else "")


async def _api_key(settings: BusSettings) -> str:
    redis = redis_client(settings.redis_url)
    try:
        key, _ = await ApiKeyStore(redis, gateway_key_namespace(settings.topic_prefix)).create(TENANT)
        return key
    finally:
        await redis.aclose()


async def _until_answering(base_url: str, headers: dict[str, str], timeout_s: float) -> None:
    """One streamed chat through the whole path (the router reads its state before routing the first)."""
    async with httpx.AsyncClient(timeout=30) as http:
        for i in range(int(timeout_s)):
            response = await http.post(
                f"{base_url}/chat/completions",
                content=chat_body(UPSTREAM_MODEL, 4, "probe", i),
                headers=headers | {"content-type": "application/json"},
            )
            if response.status_code == 200 and "[DONE]" in response.text:
                return
            await asyncio.sleep(1.0)
    raise TimeoutError(f"the llmbus path did not answer within {timeout_s:.0f}s")


@contextlib.asynccontextmanager
async def llmbus(
    label: str, tree: Path, upstream_url: str, infra: Infra, log_dir: Path, profile_dir: Path | None = None
) -> AsyncIterator[Target]:
    """The four services of `tree` in a fresh namespace; with `profile_dir`, each writes CPU profiles there."""
    settings = fresh_settings(kafka_bootstrap=infra.kafka_bootstrap, redis_url=infra.redis_url)
    await ensure_catalog(settings)
    headers = {"authorization": f"Bearer {await _api_key(settings)}"}
    policy_dir = log_dir / f"policy-{uuid.uuid4().hex[:6]}"
    policy_dir.mkdir()
    port = free_port()
    common = {"PYTHONPATH": checkout_pythonpath(tree)}
    if profile_dir is not None:
        common["LLMBUS_CPU_PROFILE"] = str(profile_dir)
    services = {
        "router": ("llmbus_services.router", {"LLMBUS_ROUTER_POLICY_PATH": str(bench_policy(policy_dir, tree))}),
        "scheduler": ("llmbus_services.scheduler", {}),
        "worker": (
            "llmbus_services.engine_worker",
            {
                "LLMBUS_WORKER_WORKER_ID": WORKER_ID,
                "LLMBUS_WORKER_MODEL": UPSTREAM_MODEL,
                "LLMBUS_WORKER_ENGINE": "openai-http",
                "LLMBUS_WORKER_OPENAI_BASE_URL": upstream_url,
            },
        ),
        "gateway": (
            "llmbus_services.gateway",
            {"LLMBUS_GATEWAY_PORT": str(port), "LLMBUS_GATEWAY_INSTANCE_ID": f"gw-peer-{uuid.uuid4().hex[:8]}"},
        ),
    }
    procs: dict[str, ServiceProc] = {}
    try:
        for name, (module, env) in services.items():
            procs[name] = ServiceProc(module, settings, env=common | env, log_dir=log_dir, name=name, cwd=tree).start()
        await wait_workers_ready(settings, {WORKER_ID}, timeout_s=180)
        base_url = f"http://127.0.0.1:{port}/v1"
        await wait_http(f"http://127.0.0.1:{port}/ready", 120)
        await _until_answering(base_url, headers, 120)
        roles = {name: p.proc.pid for name, p in procs.items() if p.proc is not None} | infra.roles
        yield Target(
            label,
            base_url,
            UPSTREAM_MODEL,
            roles,
            headers=headers,
            versions={f"{label} tree": f"{tree} @ {tree_version(tree)}"} | infra.versions,
            notes=[
                f"{label}: gateway → router → scheduler → openai-http worker, one process each, "
                f"{'private' if infra.private else 'shared'} broker and Redis, API key checked per request"
            ],
            bus_settings=settings,
        )
    except BaseException:
        for proc in procs.values():
            print(f"--- {proc.name} ---\n{proc.log_tail(20)}")
        raise
    finally:
        for proc in procs.values():
            with contextlib.suppress(Exception):
                proc.terminate(30)
        with contextlib.suppress(Exception):
            await drop_namespace(settings)
