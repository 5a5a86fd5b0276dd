"""The compose smoke's model release (deploy/compose/model_release.py) as far as a machine without a Docker
engine can check it: the script the cli container runs pushes real files with a manifest the registry
accepts, the release plan ends at 100 %, the upgrade id is read from what `llmbus models release` prints,
and the compose file's worker-version service reaches the object store and the node's artifact cache."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from llmbus.contract.manifest import load_manifest

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "deploy" / "compose"


@pytest.fixture(scope="module")
def release() -> Iterator[ModuleType]:
    """deploy/compose/model_release.py, imported as stack.py imports it (its folder on the path)."""
    sys.path.insert(0, str(COMPOSE_DIR))
    try:
        yield importlib.import_module("model_release")
    finally:
        sys.path.remove(str(COMPOSE_DIR))
        for name in ("model_release", "project", "steps"):  # generic names: no other test sees these
            sys.modules.pop(name, None)


def test_the_push_script_writes_the_files_and_a_manifest_the_registry_accepts(
    release: ModuleType, tmp_path: Path
) -> None:
    # `llmbus` stands in for the CLI: it keeps what the script hands it (the container's real one pushes it).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "llmbus"
    fake.write_text(
        '#!/bin/sh\nprintf \'%s\\n\' "$@" > "$KEEP/args"\ncp -r "$3" "$KEEP/files"\ncp "$5" "$KEEP/manifest.yaml"\n'
    )
    fake.chmod(0o755)
    env = os.environ | {"PATH": f"{bin_dir}:/usr/bin:/bin", "KEEP": str(tmp_path), "TMPDIR": str(tmp_path)}
    subprocess.run(["sh", "-c", release.push_script("2", "1")], env=env, check=True, timeout=30)

    args = (tmp_path / "args").read_text().splitlines()
    assert args[:2] == ["models", "push"] and args[-4:] == ["--to", "s3://llmbus-models/", "--format", "fp32"]
    assert json.loads((tmp_path / "files" / "config.json").read_text())["smoke_version"] == "2"
    assert (tmp_path / "files" / "model.safetensors").stat().st_size == 262144
    manifest = load_manifest(tmp_path / "manifest.yaml")
    assert (manifest.name, manifest.version, manifest.lineage.parent_version) == (release.MODEL, "2", "1")
    assert manifest.release.ramp.steps_pct[-1] == 100 and manifest.release.ramp.min_step_s == 0


def test_the_first_version_has_no_parent_and_its_manifest_validates(release: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "v1.yaml"
    path.write_text(yaml.safe_dump(release.manifest("1", None)))
    assert load_manifest(path).lineage.parent_version is None


def test_the_upgrade_id_is_read_from_the_release_command(release: ModuleType) -> None:
    said = "warning: something\nrelease upg-0123456789ab: smoke-model@2 is shadow\n"
    assert release.upgrade_id_of(said) == "upg-0123456789ab"
    with pytest.raises(release.StepFailed):
        release.upgrade_id_of("smoke-model@2 is registered already")


def test_the_versions_workers_ports_are_the_stacks_and_their_service_reaches_store_and_cache(
    release: ModuleType,
) -> None:
    project = importlib.import_module("project")  # on the path while the module fixture holds it
    assert set(release.WORKER_PORTS.values()) <= set(project.PORT_SUFFIXES)
    service = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())["services"]["worker-version"]
    assert "objectstore" in service["secrets"] and "engine-worker" in service["secrets"]
    cache_dir = service["environment"]["LLMBUS_ARTIFACT_CACHE_DIR"]
    assert any(mount.startswith(f"artifact-cache:{cache_dir}") for mount in service["volumes"])
    assert "LLMBUS_WORKER_MODEL_REF" not in service["environment"]  # each run names its version
    dockerfile = (COMPOSE_DIR / "Dockerfile").read_text()
    assert cache_dir in dockerfile  # the mount point exists, owned by the services' user
