"""deploy/compose is validated as far as a machine without a Docker engine allows (the real run is
`make compose-smoke`, deploy/compose/stack.py)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

from llmbus.artifacts import CacheSettings
from llmbus.settings import BusSettings, ObjectStoreSettings, cache_root
from llmbus_services.archive.config import ArchiveSettings
from llmbus_services.autoscaler.config import AutoscalerSettings
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.gateway.config import GatewaySettings
from llmbus_services.node_agent.config import NodeAgentSettings
from llmbus_services.router.config import RouterSettings
from llmbus_services.scheduler.config import SchedulerSettings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "deploy" / "compose" / "docker-compose.yml"
PREFIXES: dict[str, type[BaseSettings]] = {
    "LLMBUS_WORKER_": WorkerSettings,
    "LLMBUS_ROUTER_": RouterSettings,
    "LLMBUS_SCHEDULER_": SchedulerSettings,
    "LLMBUS_AUTOSCALER_": AutoscalerSettings,
    "LLMBUS_GATEWAY_": GatewaySettings,
    "LLMBUS_ARCHIVE_": ArchiveSettings,
    "LLMBUS_NODE_AGENT_": NodeAgentSettings,
    "LLMBUS_S3_": ObjectStoreSettings,
    "LLMBUS_ARTIFACT_CACHE_": CacheSettings,
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
            prefix = next(p for p in PREFIXES if var.startswith(p))
            field = var.removeprefix(prefix).lower()
            assert field in PREFIXES[prefix].model_fields, f"{name}: {var} is read by nobody"


SYSTEM_PATH = "/usr/bin:/bin:/usr/local/bin"


def compose_binaries() -> dict[str, list[str]]:
    """Debian's docker-compose 1.29 and compose v2 (the engine's plugin, or the binary
    deploy/compose/compose-v2.sh builds), those of them installed here."""
    found = {"compose-1.29": ["docker-compose"]} if shutil.which("docker-compose", path=SYSTEM_PATH) else {}
    built = cache_root() / "bin" / "docker-compose"
    plugin = ["docker", "compose"]
    if built.exists():
        found["compose-v2"] = [str(built)]
    elif shutil.which("docker", path=SYSTEM_PATH):
        answer = subprocess.run([*plugin, "version"], capture_output=True, timeout=30, check=False)
        if answer.returncode == 0:
            found["compose-v2"] = plugin
    return found


COMPOSES = compose_binaries()
LOCAL = ["-f", str(COMPOSE.parent / "local-images.yml")]


def rendered(compose: list[str], *extra: str, secrets_dir: Path) -> dict[str, Any]:
    env = {"PATH": SYSTEM_PATH, "LLMBUS_SECRETS_DIR": str(secrets_dir)}
    command = [*compose, "-f", str(COMPOSE), *extra, "config"]
    out = subprocess.run(command, check=True, timeout=60, env=env, capture_output=True, text=True)
    return dict(yaml.safe_load(out.stdout))


@pytest.mark.skipif(not COMPOSES, reason="neither docker-compose nor compose v2 installed (make compose-check)")
@pytest.mark.parametrize("compose", COMPOSES.values(), ids=COMPOSES.keys())
def test_docker_compose_accepts_the_file(compose: list[str], tmp_path: Path) -> None:
    # Every profile, with the local images (the next test renders the file alone and with the local images).
    profiles = ["--profile", "gpu", "--profile", "window", "--profile", "tools", "--profile", "init"]
    services = rendered(compose, *LOCAL, *profiles, secrets_dir=tmp_path)["services"]
    assert {"worker-vllm-1", "grafana", "jaeger", "cli", "secrets-init"} <= set(services)


def sorted_lists(value: Any) -> Any:
    """The rendered config with every list sorted (compose 1.29 prints mounts and secrets in any order)."""
    if isinstance(value, dict):
        return {key: sorted_lists(item) for key, item in value.items()}
    if isinstance(value, list):
        return sorted((sorted_lists(item) for item in value), key=repr)
    return value


@pytest.mark.skipif(not COMPOSES, reason="neither docker-compose nor compose v2 installed (make compose-check)")
@pytest.mark.parametrize("compose", COMPOSES.values(), ids=COMPOSES.keys())
def test_the_local_images_switch_changes_the_images_and_nothing_else(compose: list[str], tmp_path: Path) -> None:
    # The smoke runs the stack with local-images.yml; the README's sequence without it, on the official
    # images. Both must start every container the same way: same entrypoint scripts, environment,
    # mounts and secrets, so the broker gets the same settings (deploy/compose/security/kafka-run.sh
    # writes them in both images) and only the image differs.
    official, local = rendered(compose, secrets_dir=tmp_path), rendered(compose, *LOCAL, secrets_dir=tmp_path)
    swapped = set(yaml.safe_load((COMPOSE.parent / "local-images.yml").read_text())["services"])
    assert swapped == {"kafka-format", "kafka", "redis", "objectstore", "prometheus", "otel-collector"}
    for name in swapped:
        assert official["services"][name]["image"] != local["services"][name]["image"], name
        official["services"][name].pop("image")
        local["services"][name].pop("image")
        assert official["services"][name].get("entrypoint") or name == "otel-collector", name
    assert sorted_lists(official) == sorted_lists(local)


def test_the_window_files_it_mounts_exist() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    for name in ("grafana", "prometheus", "otel-collector", "kafka", "redis", "objectstore"):
        for mount in spec["services"][name].get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name}: {mount}"
    collector = yaml.safe_load((REPO / "deploy/otel/collector.yaml").read_text())
    assert "otlp/jaeger" in collector["exporters"]


def readme_compose_commands() -> tuple[str, list[list[str]]]:
    """The README's compose section, and each `docker compose` command of its code block as words."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Compose", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line.split("  #")[0].strip() for line in block.replace("\\\n", " ").splitlines()]
    commands = [shlex.split(re.sub(r".*\$\(", "", line).split(" | ")[0]) for line in lines if "docker compose" in line]
    assert "export COMPOSE_FILE=deploy/compose/docker-compose.yml" in lines
    return section, [words[words.index("compose") + 1 :] for words in commands]


def test_the_readme_sequence_starts_the_official_images_in_order() -> None:
    # The exact sequence a user runs with the official images: the compose file alone (no local
    # images), the image built, the secrets made before `up` (compose mounts them from files), the
    # services a command names defined, the gateway's URL its default port, and `down -v` at the end.
    section, commands = readme_compose_commands()
    spec = yaml.safe_load(COMPOSE.read_text())
    verbs = [words[0] for words in commands]
    assert verbs[:3] == ["build", "run", "up"] and commands[1][-1] == "secrets-init" and commands[2] == ["up", "-d"]
    assert commands[-1] == ["down", "-v"]
    for words in commands:
        if words[0] == "run":
            service = next(w for w in words[1:] if not w.startswith("-"))
            assert service in spec["services"], words
    gateway = spec["services"]["gateway"]["environment"]["LLMBUS_GATEWAY_PORT"]
    gateway_port = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", gateway)
    assert f"http://127.0.0.1:{gateway_port}/v1/chat/completions" in section
    # The paragraph for building without Docker Hub names the switch and the target that does it.
    offline = section.split("**Without Docker Hub**", 1)[1]
    assert "local-images.yml" in offline and "make compose-up" in offline
