"""The compose project the scripts drive: which compose binary, the ports, the engine and the images."""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from steps import StepFailed, metric_text, port_free, run, say, step, wait_for

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("LLMBUS_CACHE", Path.home() / ".cache" / "llmbus"))
FILES = ["-f", str(HERE / "docker-compose.yml"), "-f", str(HERE / "local-images.yml")]
# The ports the stack binds, after its one-digit prefix (docker-compose.yml, deploy/prometheus/prometheus.yml;
# 9091: the smoke's Prometheus 3, deploy/compose/prometheus_v3.py).
PORT_SUFFIXES = [
    "9092",
    "9093",
    "6379",
    "9000",
    "9001",
    "8000",
    "9090",
    "9091",
    "9101",
    "9102",
    "9104",
    "9105",
    "9106",
    "4317",
    "4318",
    "8888",
] + [f"91{n}" for n in (11, 12, 13, 14, 15, 21, 22, 23, 24, 31, 32)]
WORKER_METRICS = {
    "sim-strong-1": "9111",
    "sim-default-1": "9112",
    "sim-mid-1": "9113",
    "sim-small-1": "9114",
    "sim-1": "9115",
}
ONE_SHOT = {"kafka-format", "topics", "secrets-init", "cli"}
TIMINGS: list[tuple[str, float]] = []


def free_prefix() -> str:
    for prefix in "2345":
        if all(port_free(int(prefix + suffix)) for suffix in PORT_SUFFIXES):
            return prefix
    raise StepFailed("no port prefix (2-5) with all the stack's ports free on 127.0.0.1")


def _docker_has_compose() -> bool:
    return subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0


def install_compose_plugin(built: Path) -> bool:
    """Make the compose v2 built here the Docker CLI's `docker compose` (a user plugin: a link in
    $DOCKER_CONFIG/cli-plugins, default ~/.docker/cli-plugins), so that the commands the README and this
    script print (`docker compose …`) work as printed. True when `docker compose` answers afterwards."""
    plugins = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker")) / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    link = plugins / "docker-compose"
    if not link.exists():
        link.unlink(missing_ok=True)  # a dangling link from an earlier cache
        link.symlink_to(built)
    return _docker_has_compose()


def compose_binary() -> list[str]:
    """LLMBUS_COMPOSE if set; else compose v2 (`docker compose`: the engine's plugin, or built from its Go module
    into the cache and linked in as the Docker CLI's plugin), else Debian's docker-compose 1.29 (installed when
    compose v2 cannot be built and we are root)."""
    if chosen := os.environ.get("LLMBUS_COMPOSE"):
        return chosen.split()
    if _docker_has_compose():
        return ["docker", "compose"]
    built = CACHE / "bin" / "docker-compose"
    if not built.exists():
        try:  # compose-v2.sh finds a Go toolchain, or fetches one from the Go module proxy (deploy/lib/go.sh)
            with step("compose v2 from its Go module (once)"):
                run([str(HERE / "compose-v2.sh")], timeout_s=1200, show=True)
        except StepFailed as failed:
            say(f"    compose v2 could not be built ({failed}); trying Debian's docker-compose 1.29")
    if built.exists():
        return ["docker", "compose"] if install_compose_plugin(built) else [str(built)]
    if not shutil.which("docker-compose") and os.geteuid() == 0:
        with step("Debian's docker-compose (compose v2 could not be built)"):
            run(
                ["apt-get", "install", "-y", "-qq", "docker-compose"],
                env=os.environ | {"DEBIAN_FRONTEND": "noninteractive"},
            )
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise StepFailed("neither compose v2 nor docker-compose is installed")


class Stack:
    def __init__(self, project: str, prefix: str, secrets_dir: Path) -> None:
        self.project = project
        self.prefix = prefix
        self.secrets_dir = secrets_dir
        self.env = os.environ | {"LLMBUS_PORT_PREFIX": prefix, "LLMBUS_SECRETS_DIR": str(secrets_dir)}
        self.compose = [*compose_binary(), "-p", project, *FILES]

    def command_line(self, *args: str) -> str:
        """`args` as a shell command a user can paste: this stack's compose command, with the environment it needs
        where it differs from the compose file's defaults (port prefix 2, secrets in deploy/compose/secrets)."""
        env = [f"LLMBUS_PORT_PREFIX={self.prefix}"] if self.prefix != "2" else []
        if self.secrets_dir.resolve() != (HERE / "secrets").resolve():
            env.append(f"LLMBUS_SECRETS_DIR={shlex.quote(str(self.secrets_dir))}")
        return " ".join([*env, *map(shlex.quote, [*self.compose, *args])])

    def __call__(self, *args: str, timeout_s: float = 600, check: bool = True, show: bool = False) -> str:
        return run([*self.compose, *args], env=self.env, timeout_s=timeout_s, check=check, show=show)

    def port(self, suffix: str) -> int:
        return int(self.prefix + suffix)

    def containers(self) -> dict[str, dict[str, Any]]:
        """Service name → the engine's state of its container (status, health, exit code)."""
        ids = self("ps", "-a", "-q").split()
        if not ids:
            return {}
        inspected = json.loads(run(["docker", "inspect", *ids]))
        return {c["Config"]["Labels"]["com.docker.compose.service"]: c["State"] for c in inspected}

    def failed_services(self) -> list[str]:
        failed = []
        for name, state in self.containers().items():
            health = state.get("Health", {}).get("Status")
            exited_badly = state["Status"] == "exited" and (name not in ONE_SHOT or state["ExitCode"] != 0)
            if exited_badly or state.get("Restarting") or health == "unhealthy" or state.get("RestartCount", 0):
                failed.append(name)
        return failed

    def print_failures(self) -> None:
        say(self("ps", "-a", check=False))
        failed = self.failed_services() or [name for name in self.containers() if name not in ONE_SHOT]
        for name in failed:
            say(f"---- logs of {name} (last 60 lines)")
            say(self("logs", "--no-color", "--tail", "60", name, check=False))

    def cli(self, *args: str) -> str:
        """An `llmbus` command in the image, as the operator principal."""
        return self("run", "--rm", "-T", "-e", "COLUMNS=160", "cli", "llmbus", *args, timeout_s=120)

    def up(self) -> None:
        with step("secrets (secrets-init: one password per principal)"):
            self("run", "--rm", "-T", "secrets-init")
        with step("up -d: Kafka, Redis, topics + ACLs, 7 services, 5 sim workers, autoscaler, Prometheus, collector"):
            self("up", "-d", "--no-build", timeout_s=600, show=True)
        with step("healthy: gateway ready, every worker ready, every service's /metrics answers"):
            wait_for("gateway healthy", self.gateway_healthy, 180, self.fail_reason)
            for worker, suffix in WORKER_METRICS.items():
                wait_for(f"{worker} ready", functools.partial(self.worker_ready, suffix), 120, self.fail_reason)
            for suffix in ("9101", "9102", "9104", "9105", "9106", "9107"):
                wait_for(f"/metrics on {self.port(suffix)}", functools.partial(self.metrics_answer, suffix), 60)

    def metrics_answer(self, suffix: str) -> bool:
        return metric_text(self.port(suffix)) != ""

    def fail_reason(self) -> str | None:
        failed = self.failed_services()
        return f"failed: {', '.join(failed)}" if failed else None

    def gateway_healthy(self) -> bool:
        state = self.containers().get("gateway", {})
        return bool(state.get("Health", {}).get("Status") == "healthy")

    def worker_ready(self, suffix: str) -> bool:
        return any(
            line.startswith("llmbus_worker_ready{") and line.endswith(" 1.0")
            for line in metric_text(self.port(suffix)).splitlines()
        )

    def down(self) -> None:
        with step("down -v"):
            self("down", "-v", "--remove-orphans", timeout_s=300, show=True)


def prepare() -> bool:
    """Engine and images; True when this run started the engine (so it stops it after)."""
    with step("Docker engine (running one, or dockerd without bridge or firewall rules)"):
        was_running = (
            subprocess.run([str(HERE / "engine.sh"), "status"], capture_output=True, check=False).returncode == 0
        )
        run([str(HERE / "engine.sh"), "start"], show=True)
    with step("images: debian base (debootstrap if missing), llmbus, Kafka, Redis, Prometheus, collector"):
        run([str(HERE / "images.sh")], timeout_s=1800, show=True)
    return not was_running
