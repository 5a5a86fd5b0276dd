"""deploy/compose is validated as far as a machine without a Docker engine allows."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from llmbus.settings import BusSettings
from services.autoscaler.config import AutoscalerSettings
from services.engine_worker.config import WorkerSettings
from services.gateway.config import GatewaySettings
from services.router.config import RouterSettings
from services.scheduler.config import SchedulerSettings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "deploy" / "compose" / "docker-compose.yml"
PREFIXES = {
    "LLMBUS_WORKER_": WorkerSettings,
    "LLMBUS_ROUTER_": RouterSettings,
    "LLMBUS_SCHEDULER_": SchedulerSettings,
    "LLMBUS_AUTOSCALER_": AutoscalerSettings,
    "LLMBUS_GATEWAY_": GatewaySettings,
    "LLMBUS_": BusSettings,
}


def test_compose_services_run_modules_that_exist_with_settings_they_read() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    llmbus_services = {n: s for n, s in spec["services"].items() if s.get("image", "").startswith("llmbus")}
    assert {"router", "scheduler", "gateway", "worker-sim-1", "topics"} <= set(llmbus_services)
    for name, service in llmbus_services.items():
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
def test_docker_compose_accepts_the_file() -> None:
    for extra in ([], ["--profile", "gpu"]):
        subprocess.run(["docker-compose", "-f", str(COMPOSE), *extra, "config", "-q"], check=True, timeout=60)


def test_the_window_is_wired_prometheus_scrapes_every_service_grafana_and_traces_provisioned() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    assert {"prometheus", "grafana", "otel-collector", "jaeger", "gateway"} <= set(services)
    prometheus = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    targets = [t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    for target in targets:
        host, port = target.split(":")
        env = services[host]["environment"]
        assert port in (env.get("LLMBUS_METRICS_PORT"), env.get("LLMBUS_GATEWAY_PORT")), target
    scraped = {t.split(":")[0] for t in targets}
    assert {n for n, s in services.items() if s.get("command", [None])[:2] == ["python", "-m"]} <= scraped
    for mount in (
        services["grafana"]["volumes"] + services["prometheus"]["volumes"] + services["otel-collector"]["volumes"]
    ):
        assert (COMPOSE.parent / mount.split(":")[0]).exists(), mount
    collector = yaml.safe_load((REPO / "deploy/otel/collector.yaml").read_text())
    assert collector["exporters"]["otlp/jaeger"]["endpoint"].startswith("jaeger:")
    assert spec["x-llmbus-env"]["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://otel-collector:4318")
