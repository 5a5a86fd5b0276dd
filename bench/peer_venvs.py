"""The peers' own virtualenvs, made by the peer benchmark under the llmbus cache (never the project's venv).

Each peer (TensorZero's wheel, LiteLLM's proxy, the inference-perf load generator) is pinned and
installed from PyPI into `<cache>/peer/<name>-<version>/`, once per machine: a venv whose install
finished holds a `.complete` marker, and one without it is made again. inference-perf needs
Python 3.12 or newer; `python_at_least` finds one on this machine (on PATH, or a pyenv version).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from llmbus.settings import cache_root

TENSORZERO_VERSION = "2026.6.0"
LITELLM_VERSION = "1.108.7"
INFERENCE_PERF_VERSION = "0.7.0"
INSTALL_TIMEOUT_S = 1800  # a first install on two busy cores (LiteLLM's proxy pulls ~100 packages)


@dataclass(frozen=True)
class PeerVenv:
    name: str
    requirement: str  # what pip installs, pinned
    python: str  # the interpreter the venv is made from

    @property
    def path(self) -> Path:
        return cache_root() / "peer" / self.name

    def bin(self, program: str) -> Path:
        return self.path / "bin" / program

    def ensure(self) -> PeerVenv:
        """Make the venv and install the requirement unless a finished install is there."""
        marker = self.path / ".complete"
        if marker.exists():
            return self
        shutil.rmtree(self.path, ignore_errors=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        print(f"[peer] making {self.path} ({self.requirement}, first run only)", file=sys.stderr, flush=True)
        subprocess.run([self.python, "-m", "venv", str(self.path)], check=True, timeout=300)
        log = self.path / "install.log"
        with log.open("wb") as out:
            done = subprocess.run(
                [str(self.bin("pip")), "install", "--disable-pip-version-check", self.requirement],
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=INSTALL_TIMEOUT_S,
            )
        if done.returncode != 0:
            raise RuntimeError(f"pip install {self.requirement} failed; see {log}")
        marker.write_text(self.requirement + "\n")
        return self

    def version_of(self, distribution: str) -> str:
        """The installed version of a distribution in this venv."""
        code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
        return subprocess.run(
            [str(self.bin("python")), "-c", code], check=True, capture_output=True, text=True, timeout=60
        ).stdout.strip()

    def python_version(self) -> str:
        out = subprocess.run([str(self.bin("python")), "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.strip().removeprefix("Python ")


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    major, minor = out.stdout.split()
    return int(major), int(minor)


def python_at_least(minimum: tuple[int, int]) -> str | None:
    """An interpreter of at least `minimum` on this machine: $LLMBUS_PEER_PYTHON, pythonX.Y on PATH,
    then pyenv's versions. None when there is none (PyPI does not serve interpreters)."""
    candidates = [os.environ.get("LLMBUS_PEER_PYTHON", "")]
    candidates += [shutil.which(f"python3.{minor}") or "" for minor in range(minimum[1], minimum[1] + 6)]
    pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    candidates += sorted(glob.glob(f"{pyenv_root}/versions/3.*/bin/python3"), reverse=True)
    for python in candidates:
        if not python:
            continue
        resolved = os.path.realpath(python)
        # pyenv's shims exit non-zero for a version that is not selected; only real interpreters count.
        version = _version_of(resolved)
        if version is not None and version >= minimum:
            return resolved
    return None


def tensorzero() -> PeerVenv:
    return PeerVenv(f"tensorzero-{TENSORZERO_VERSION}", f"tensorzero=={TENSORZERO_VERSION}", sys.executable)


def litellm() -> PeerVenv:
    return PeerVenv(f"litellm-{LITELLM_VERSION}", f"litellm[proxy]=={LITELLM_VERSION}", sys.executable)


def inference_perf(python: str) -> PeerVenv:
    return PeerVenv(f"inference-perf-{INFERENCE_PERF_VERSION}", f"inference-perf=={INFERENCE_PERF_VERSION}", python)
