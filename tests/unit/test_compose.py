"""deploy/compose is validated as far as a machine without a Docker engine allows (the real run is
`make compose-smoke`, deploy/compose/stack.py)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

from llmbus.settings import BusSettings
from services.archive.config import ArchiveSettings
from services.autoscaler.config import AutoscalerSettings
from services.engine_worker.config import WorkerSettings
from services.gateway.config import GatewaySettings
from services.router.config import RouterSettings
from services.scheduler.config import SchedulerSettings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "deploy" / "compose" / "docker-compose.yml"
PREFIXES: dict[str, type[BaseSettings]] = {
    "LLMBUS_WORKER_": WorkerSettings,
    "LLMBUS_ROUTER_": RouterSettings,
    "LLMBUS_SCHEDULER_": SchedulerSettings,
    "LLMBUS_AUTOSCALER_": AutoscalerSettings,
    "LLMBUS_GATEWAY_": GatewaySettings,
    "LLMBUS_ARCHIVE_": ArchiveSettings,
    "LLMBUS_": BusSettings,
}


def llmbus_services() -> dict[str, Any]:
    spec = yaml.safe_load(COMPOSE.read_text())
    return {
        n: s
        for n, s in spec["services"].items()
        if "LLMBUS_IMAGE" in s.get("image", "") or s["image"].startswith("llmbus")
    }


def test_compose_services_run_modules_that_exist_with_settings_they_read() -> None:
    services = llmbus_services()
    assert {"router", "scheduler", "gateway", "worker-sim", "topics", "autoscaler"} <= set(services)
    for name, service in services.items():
        command = service["command"]
        if command[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(command[2]) is not None, f"{name}: no module {command[2]}"
        for var in service.get("environment", {}):
            if var.startswith("OTEL_"):  # OpenTelemetry's own variables, read by its SDK
                continue
            if var in ("LLMBUS_STACK_AUTH", "KAFKA_CREDENTIALS"):  # llmbus.cli.stack_auth, for the workers it starts
                continue
            prefix = next(p for p in PREFIXES if var.startswith(p))
            field = var.removeprefix(prefix).lower()
            assert field in PREFIXES[prefix].model_fields, f"{name}: {var} is read by nobody"


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed (make compose-check)")
def test_docker_compose_accepts_the_file(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "LLMBUS_SECRETS_DIR": str(tmp_path)}
    local = ["-f", str(COMPOSE.parent / "local-images.yml")]
    for extra in ([], local, ["--profile", "gpu", "--profile", "window", "--profile", "tools", "--profile", "init"]):
        subprocess.run(["docker-compose", "-f", str(COMPOSE), *extra, "config", "-q"], check=True, timeout=60, env=env)


def test_the_window_files_it_mounts_exist() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    for name in ("grafana", "prometheus", "otel-collector", "kafka", "redis"):
        for mount in spec["services"][name].get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name}: {mount}"
    collector = yaml.safe_load((REPO / "deploy/otel/collector.yaml").read_text())
    assert "otlp/jaeger" in collector["exporters"]
