"""A fork server for the tests' service processes: the imports are paid once, not once per process.

`make test` is bound by CPU, and a service's `python -m llmbus_services.<name>` spends about a
CPU-second importing pydantic, aiokafka, redis and its own modules before it does any work; the suite
starts some 170 of them. The fork server is one process per test worker that imports those modules
once and then forks a child for each service: the child takes the request's environment, working
directory and log file and runs the module as `__main__`, exactly as `python -m` would.

A child is still a real process of its own (its own pid, signals, exit code), so SIGKILL and SIGTERM
tests mean what they did. It is the fork server's child, not the test's, so the server reports each
exit code back and `ForkedProcess` answers `poll`, `wait`, `kill` like a `subprocess.Popen`.

Only what a fork can reproduce is served: the same interpreter, working directory and `PYTHON*`
variables as the server's (those act at interpreter start), no interpreter options. Anything else
(a benchmark's baseline checkout, `-X importtime`) is started with `spawn_module`. Tests turn the
server on with `LLMBUS_FORKSERVER=1` (tests/conftest.py); the CLI's stacks and benchmarks never use it.

    python -m llmbus_tools.harness.forkserver MODULE...   # the server: preloads MODULEs, then serves
"""

from __future__ import annotations

import gc
import importlib
import io
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ENABLE_ENV = "LLMBUS_FORKSERVER"

# Imported once by the server. Nothing here may start threads or import torch: a fork copies only
# the forking thread, and a vLLM worker child imports torch after it has taken its environment.
PRELOAD = (
    "llmbus_services.router.app",
    "llmbus_services.scheduler.app",
    "llmbus_services.engine_worker.app",
    "llmbus_services.engine_worker.adapters.engines.sim",
    "llmbus_services.engine_worker.adapters.engines.openai_http",
    "llmbus_services.gateway.app",
    "llmbus_services.cost_accounting.app",
    "llmbus_services.shadow_comparator.app",
    "llmbus_services.autoscaler.app",
    "llmbus_services.archive.app",
)

_REPLY_TIMEOUT_S = 60.0


# --- the server ---------------------------------------------------------------------------------


def _send(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _reap() -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        cpu_s = usage.ru_utime + usage.ru_stime
        _send({"exited": pid, "code": os.waitstatus_to_exitcode(status), "cpu_s": cpu_s})


def _serve(wakeup_r: int, wakeup_w: int) -> dict[str, Any] | None:
    """Fork a child per request until stdin closes. Returns the request in a child, None in the server."""
    pending = b""
    while True:
        ready, _, _ = select.select([0, wakeup_r], [], [])
        if wakeup_r in ready:
            while True:
                try:
                    if not os.read(wakeup_r, 512):
                        break
                except BlockingIOError:
                    break
            _reap()
        if 0 not in ready:
            continue
        data = os.read(0, 1 << 16)
        if not data:
            return None  # the test worker is gone; children live on as they would have
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                os.close(wakeup_r)
                os.close(wakeup_w)
                return dict(request)
            _send({"spawned": pid})


def _become(request: dict[str, Any]) -> None:
    """In the child: the request's stdio, directory and environment, then its module as __main__."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(devnull)
    os.close(log)
    # Unbuffered, as PYTHONUNBUFFERED makes them: a SIGKILLed service's last lines are in its log.
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request["module"]]


def main() -> None:
    for module in sys.argv[1:]:
        importlib.import_module(module)
    if threading.active_count() > 1:  # a fork would copy a lock some other thread holds
        raise RuntimeError(f"preloading started threads: {[t.name for t in threading.enumerate()]}")
    gc.collect()
    gc.freeze()  # the preloaded objects stay out of the children's collections: their pages stay shared
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_r, False)
    os.set_blocking(wakeup_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wakeup_w)
    _send({"ready": os.getpid()})
    request = _serve(wakeup_r, wakeup_w)
    if request is None:
        return
    _become(request)
    # Outside every frame of the server, so a SystemExit or an uncaught error ends the child the way
    # it ends `python -m`.
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


# --- the client ---------------------------------------------------------------------------------


class ForkedProcess:
    """A fork server's child, answering what the tests ask of a `subprocess.Popen`."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._server.collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._server.collect(min(left, 1.0))
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # an exited pid may already be someone else's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The client end: one server process per test worker, started on first use."""

    def __init__(self, cwd: Path, env: Mapping[str, str], preload: tuple[str, ...] = PRELOAD) -> None:
        self.cwd = cwd.resolve()
        self.env = dict(env)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__, *preload],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._in = self._proc.stdin
        self._out = self._proc.stdout.fileno()
        self._pending = b""
        self._spawned: list[int] = []
        self._live: dict[int, ForkedProcess] = {}  # a pid is freed only once its exit is reported
        # What a test's CPU accounting adds to its own (tests/cpu_usage.py): children started, and the
        # CPU-seconds of those that have exited (the server reaps them, not the test's process).
        self.spawned: list[str] = []
        self.reaped_cpu_s = 0.0
        self._lock = threading.Lock()

    def serves(self, *, env: Mapping[str, str], cwd: Path, python_args: tuple[str, ...]) -> bool:
        """Whether a fork reproduces `python [python_args] -m` with this env and cwd."""

        def startup(variables: Mapping[str, str]) -> dict[str, str]:
            return {k: v for k, v in variables.items() if k.startswith("PYTHON") and k != "PYTHONUNBUFFERED"}

        return (
            self._proc.poll() is None
            and not python_args
            and cwd.resolve() == self.cwd
            and startup(env) == startup(self.env)
        )

    def spawn(self, module: str, *, env: Mapping[str, str], log_path: Path) -> ForkedProcess:
        log_path.open("ab").close()  # there on return, as spawn_module leaves it
        request = {
            "module": module,
            "env": {**env, "PYTHONUNBUFFERED": "1"},
            "cwd": str(self.cwd),
            "log": str(log_path),
        }
        with self._lock:
            self._in.write((json.dumps(request) + "\n").encode())
            self._in.flush()
            deadline = time.monotonic() + _REPLY_TIMEOUT_S
            while not self._spawned:
                left = deadline - time.monotonic()
                if left <= 0 or self._proc.poll() is not None:
                    raise RuntimeError(f"fork server gave no child for {module} (exit {self._proc.returncode})")
                self._read(left)
            pid = self._spawned.pop(0)
            child = self._live[pid] = ForkedProcess(self, pid, [sys.executable, "-m", module])
            self.spawned.append(" ".join(child.args))
        return child

    def close(self) -> None:
        """Stop serving (children already started live on)."""
        self._in.close()
        self._proc.wait(timeout=10)

    def collect(self, timeout_s: float) -> None:
        """Take in the exit codes the server has reported, waiting up to `timeout_s` for one."""
        with self._lock:
            self._read(timeout_s)

    def _read(self, timeout_s: float) -> None:
        ready, _, _ = select.select([self._out], [], [], max(timeout_s, 0))
        if not ready:
            return
        data = os.read(self._out, 1 << 16)
        if not data:
            time.sleep(min(timeout_s, 0.05))  # the server is gone: nothing more will come
            return
        self._pending += data
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            message = json.loads(line)
            if "spawned" in message:
                self._spawned.append(message["spawned"])
            elif "exited" in message:
                self.reaped_cpu_s += message["cpu_s"]
                if child := self._live.pop(message["exited"], None):
                    child.returncode = message["code"]


_server: ForkServer | None = None
_server_lock = threading.Lock()


def current() -> ForkServer | None:
    """This process's fork server, if it started one."""
    return _server


def server_for(env: Mapping[str, str], cwd: Path, python_args: tuple[str, ...]) -> ForkServer | None:
    """This process's fork server when tests enabled it and it can serve this start, else None."""
    global _server
    if os.environ.get(ENABLE_ENV) != "1":
        return None
    with _server_lock:
        if _server is None or _server._proc.poll() is not None:
            _server = ForkServer(cwd, {k: v for k, v in os.environ.items() if k != ENABLE_ENV})
    return _server if _server.serves(env=env, cwd=cwd, python_args=python_args) else None


if __name__ == "__main__":
    main()
