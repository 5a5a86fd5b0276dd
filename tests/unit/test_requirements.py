"""Runtime, dev and bench requirements stay split, declared alike in pyproject.toml, and pinned."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REQS = REPO / "requirements"


def names(lines: list[str]) -> set[str]:
    out = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            out.add(re.split(r"[\[<>=!~;\s]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return out


def file_names(name: str) -> set[str]:
    return names((REQS / name).read_text().splitlines())


def test_pyproject_declares_what_the_requirement_files_list() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert names(project["dependencies"]) == file_names("runtime.txt")
    assert names(project["optional-dependencies"]["dev"]) == file_names("dev.txt")
    assert names(project["optional-dependencies"]["bench"]) == file_names("bench.txt")


def test_runtime_holds_no_test_or_bench_tools_and_is_pinned() -> None:
    runtime = file_names("runtime.txt")
    assert not runtime & (file_names("dev.txt") | file_names("bench.txt"))
    assert runtime <= file_names("constraints.txt")
    for line in (REQS / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][^\s]*", line), line


def test_production_image_installs_the_runtime_only() -> None:
    dockerfile = (REPO / "deploy/compose/Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert any("requirements/runtime.txt" in line and "-c requirements/constraints.txt" in line for line in installs)
    assert not re.search(r"(base|dev|bench)\.txt", dockerfile)


def test_a_development_machine_gets_everything() -> None:
    base = (REQS / "base.txt").read_text()
    assert {"-r runtime.txt", "-r dev.txt", "-r bench.txt"} <= set(base.splitlines())
