"""The local stack: Kafka and Redis from the project's scripts, services as processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from llmbus.cli import stack_auth

REPO = Path(__file__).resolve().parents[4]
CACHE = Path(os.environ.get("LLMBUS_CACHE", Path.home() / ".cache" / "llmbus"))
RUN_DIR = CACHE / "run"


@dataclass(frozen=True)
class ServiceProcess:
    name: str  # unique per process: "router", "worker-1"
    module: str  # python -m target
    env: dict[str, str] = field(default_factory=dict)

    @property
    def pid_file(self) -> Path:
        return RUN_DIR / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return RUN_DIR / f"{self.name}.log"


def run_script(script: str, action: str) -> None:
    subprocess.run([str(REPO / script), action], check=True, timeout=600)


def infra_up() -> None:
    run_script("deploy/kafka/kafka.sh", "start")
    run_script("deploy/redis/redis.sh", "start")
    if stack_auth.secured():
        stack_auth.secure_broker(RUN_DIR)


def infra_down() -> None:
    run_script("deploy/kafka/kafka.sh", "stop")
    run_script("deploy/redis/redis.sh", "stop")


def pid_of(proc: ServiceProcess) -> int | None:
    try:
        pid = int(proc.pid_file.read_text())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return None


def start(proc: ServiceProcess) -> int:
    if (pid := pid_of(proc)) is not None:
        return pid
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"PYTHONUNBUFFERED": "1"} | proc.env | stack_auth.service_env(RUN_DIR, proc.module)
    with proc.log_file.open("ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", proc.module],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    proc.pid_file.write_text(str(child.pid))
    return child.pid


def stop(proc: ServiceProcess, grace_s: float = 30.0) -> bool:
    """SIGTERM (the service drains), then SIGKILL after grace_s. True if it was running."""
    pid = pid_of(proc)
    if pid is None:
        proc.pid_file.unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # our own child (an autoscaler's worker) would stay a zombie
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
    proc.pid_file.unlink(missing_ok=True)
    return True


def default_services(workers: int = 2, sim_speedup: float = 1.0) -> list[ServiceProcess]:
    # Only sim workers run locally: requests that name no model go to the sim model, not a hosted one.
    router_env = {"LLMBUS_ROUTER_DEFAULT_MODEL": "sim-llama-8b"}
    procs = [
        ServiceProcess("router", "services.router", router_env),
        ServiceProcess("scheduler", "services.scheduler"),
        ServiceProcess("cost", "services.cost_accounting"),
        ServiceProcess("comparator", "services.shadow_comparator"),
    ]
    # The OpenAI-compatible front door on http://127.0.0.1:8000 (keys: `llmbus keys create`).
    procs.append(ServiceProcess("gateway", "services.gateway", {"LLMBUS_GATEWAY_INSTANCE_ID": "gw-local"}))
    for i in range(1, workers + 1):
        procs.append(
            ServiceProcess(
                f"worker-{i}",
                "services.engine_worker",
                {
                    "LLMBUS_WORKER_WORKER_ID": f"sim-{i}",
                    "LLMBUS_WORKER_ENGINE": "sim",
                    "LLMBUS_WORKER_SIM_SPEEDUP": str(sim_speedup),
                },
            )
        )
    # Scales the pool beyond the static workers on queue wait and back (services/autoscaler).
    procs.append(ServiceProcess("autoscaler", "services.autoscaler", {"LLMBUS_WORKER_SIM_SPEEDUP": str(sim_speedup)}))
    return procs


def running_services() -> list[ServiceProcess]:
    if not RUN_DIR.exists():
        return []
    return [ServiceProcess(p.stem, "") for p in sorted(RUN_DIR.glob("*.pid")) if p.stem not in ("kafka", "redis")]
