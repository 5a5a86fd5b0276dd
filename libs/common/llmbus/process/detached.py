"""Service processes on this machine: `python -m <module>`, detached, with pid and log files in one run directory.

The dev stack (`llmbus up`, llmbus.cli.stack) and the autoscaler's local actuator both start and
stop services through these, so `llmbus down` stops the workers the autoscaler started too. What
a process connects as is its caller's business: `start` takes the extra environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llmbus.process.launch import spawn_module
from llmbus.settings import cache_root

REPO = Path(__file__).resolve().parents[4]


def run_dir() -> Path:
    """Where the pid and log files are: `$LLMBUS_CACHE/run` (default ~/.cache/llmbus/run)."""
    return cache_root() / "run"


@dataclass(frozen=True)
class ServiceProcess:
    name: str  # unique per process: "router", "worker-1"
    module: str  # python -m target
    env: dict[str, str] = field(default_factory=dict)

    @property
    def pid_file(self) -> Path:
        return run_dir() / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return run_dir() / f"{self.name}.log"


def pid_of(proc: ServiceProcess) -> int | None:
    try:
        pid = int(proc.pid_file.read_text())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return None


def start(proc: ServiceProcess, extra_env: Mapping[str, str] | None = None) -> int:
    """Start `proc` unless it runs (its pid either way); `extra_env` over this process's and proc's own."""
    if (pid := pid_of(proc)) is not None:
        return pid
    run_dir().mkdir(parents=True, exist_ok=True)
    env = os.environ | proc.env | dict(extra_env or {})
    child = spawn_module(proc.module, env=env, log_path=proc.log_file, cwd=REPO, own_session=True)
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
