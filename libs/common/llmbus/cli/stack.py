"""The local stack: Kafka, Redis and the object store from the project's scripts, services as processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import dataclass

from redis.exceptions import RedisError

from llmbus.cli import stack_auth
from llmbus.process import detached
from llmbus.process.detached import REPO, ServiceProcess, run_dir
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client


def run_script(script: str, action: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([str(REPO / script), action], check=True, timeout=600, env=os.environ | (env or {}))


def infra_up() -> None:
    run_script("deploy/kafka/kafka.sh", "start")
    # AOF (fsync every second): API keys, exactly-once markers and held results survive a restart.
    # Secured (AUTH=1): every service its own ACL user, from the principals' passwords kafka.sh made.
    run_script("deploy/redis/redis.sh", "start", {"REDIS_APPENDONLY": "yes"} | stack_auth.redis_env(run_dir()))
    run_script("deploy/objectstore/objectstore.sh", "start")  # model artifacts (S3 API on 127.0.0.1:9000)
    asyncio.run(persist_redis(BusSettings()))


async def persist_redis(settings: BusSettings) -> None:
    """Turn the append-only file on in a Redis that was already running without it (`make test`'s)."""
    client = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
    try:
        await client.config_set("appendonly", "yes")
    except RedisError as exc:  # e.g. CONFIG renamed away: the stack runs, without the guarantee
        print(f"warning: could not turn Redis's append-only file on: {exc}", file=sys.stderr)
    finally:
        await client.aclose()
    if stack_auth.secured():
        stack_auth.secure_broker(run_dir())


def infra_down() -> None:
    run_script("deploy/kafka/kafka.sh", "stop")
    run_script("deploy/redis/redis.sh", "stop", stack_auth.redis_env(run_dir()))
    run_script("deploy/objectstore/objectstore.sh", "stop")


def start(proc: ServiceProcess) -> int:
    """Start a stack process as its own principal on a secured stack (llmbus.cli.stack_auth)."""
    return detached.start(proc, stack_auth.service_env(run_dir(), proc.module))


@dataclass(frozen=True)
class TierWorker:
    """A sim worker standing in for one model of the default router policy."""

    model: str
    sim_profile: str
    max_model_len: int  # the policy's window for the model, so that what the router admits fits


# Every model a rule or the default of services/router/policies/default.yaml routes to, served
# by a sim worker of that name (tests/integration/test_dev_fleet.py holds the two together).
# Hosted models have no calibrated profile: they take the 8B model's step times.
TIER_FLEET = (
    TierWorker("gpt-4.1", "llama-3.1-8b-h100", 128_000),  # strong: complexity > 0.8
    TierWorker("gpt-4.1-mini", "llama-3.1-8b-h100", 128_000),  # default
    TierWorker("llama-3.3-70b-instruct", "llama-3.3-70b-h100-tp4", 32_768),  # mid: token budget < 5000
    TierWorker("qwen2.5-coder-1.5b-instruct", "qwen2.5-7b-h100", 8192),  # small: quick_edit, tab_completion
)
SIM_MODEL = "sim-llama-8b"  # what benchmarks and the autoscaler's pool use
# /metrics of each process on 127.0.0.1 (`llmbus status` lists them); workers from WORKER_METRICS_PORT.
METRICS_PORTS = {
    "router": 9101,
    "scheduler": 9102,
    "cost": 9103,
    "comparator": 9104,
    "gateway": 9105,
    "autoscaler": 9106,
    "archive": 9107,
    "node-agent": 9108,
}
WORKER_METRICS_PORT = 9110


def _worker(name: str, worker_id: str, model: str, sim_speedup: float, **more: str) -> ServiceProcess:
    env = {
        "LLMBUS_WORKER_WORKER_ID": worker_id,
        "LLMBUS_WORKER_ENGINE": "sim",
        "LLMBUS_WORKER_MODEL": model,
        "LLMBUS_WORKER_SIM_SPEEDUP": str(sim_speedup),
    }
    return ServiceProcess(name, "llmbus_services.engine_worker", env | more)


def default_services(workers: int = 2, sim_speedup: float = 1.0) -> list[ServiceProcess]:
    """The services, one sim worker per model of the default policy, and `workers` of the sim model."""
    procs = [
        ServiceProcess("router", "llmbus_services.router"),
        ServiceProcess("scheduler", "llmbus_services.scheduler"),
        ServiceProcess("cost", "llmbus_services.cost_accounting"),
        ServiceProcess("comparator", "llmbus_services.shadow_comparator"),
        # Results, costs, comparisons, feedback and prompts as Parquet (LLMBUS_ARCHIVE_DIR; `llmbus export rlhf`).
        ServiceProcess("archive", "llmbus_services.archive"),
        # The OpenAI-compatible front door on http://127.0.0.1:8000 (keys: `llmbus keys create`).
        ServiceProcess("gateway", "llmbus_services.gateway", {"LLMBUS_GATEWAY_INSTANCE_ID": "gw-local"}),
        # This machine's profile and health on llm.nodes (its node id, the host name, is the workers' default).
        ServiceProcess("node-agent", "llmbus_services.node_agent"),
    ]
    for tier in TIER_FLEET:
        procs.append(
            _worker(
                f"worker-{tier.model}",
                f"sim-{tier.model}",
                tier.model,
                sim_speedup,
                LLMBUS_WORKER_SIM_PROFILE=tier.sim_profile,
                LLMBUS_WORKER_SIM_MAX_MODEL_LEN=str(tier.max_model_len),
            )
        )
    procs += [_worker(f"worker-{i}", f"sim-{i}", SIM_MODEL, sim_speedup) for i in range(1, workers + 1)]
    # Scales the pool beyond the static workers on queue wait and back (services/autoscaler).
    procs.append(
        ServiceProcess("autoscaler", "llmbus_services.autoscaler", {"LLMBUS_WORKER_SIM_SPEEDUP": str(sim_speedup)})
    )
    return [_with_metrics(proc, i) for i, proc in enumerate(procs)]


def _with_metrics(proc: ServiceProcess, index: int) -> ServiceProcess:
    port = METRICS_PORTS.get(proc.name, WORKER_METRICS_PORT + index)
    env = proc.env | {"LLMBUS_METRICS_PORT": str(port), "LLMBUS_METRICS_HOST": "127.0.0.1"}
    return ServiceProcess(proc.name, proc.module, env)


def metrics_urls() -> dict[str, str]:
    """/metrics of each running service of the stack, as started (name → URL)."""
    running = {proc.name for proc in running_services()}
    return {
        proc.name: f"http://127.0.0.1:{proc.env['LLMBUS_METRICS_PORT']}/metrics"
        for proc in default_services(workers=_static_sim_workers())
        if proc.name in running
    }


def _static_sim_workers() -> int:
    names = {p.name for p in running_services()}
    return sum(1 for n in names if n.removeprefix("worker-").isdigit())


def running_services() -> list[ServiceProcess]:
    if not run_dir().exists():
        return []
    return [ServiceProcess(p.stem, "") for p in sorted(run_dir().glob("*.pid")) if p.stem not in ("kafka", "redis")]
