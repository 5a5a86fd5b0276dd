"""The tests' fork server starts a module the way `python -m` would, and reports its exit like Popen."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmbus_tools.harness.forkserver import ForkServer

PROBE = textwrap.dedent(
    """
    import os, sys, time
    print("argv0", os.path.basename(sys.argv[0]), "name", __name__)
    print("cwd", os.getcwd())
    print("env", os.environ.get("PROBE_VALUE"), os.environ.get("ONLY_IN_SERVER"))
    print("unbuffered", os.environ.get("PYTHONUNBUFFERED"))
    if os.environ.get("PROBE_SLEEP"):
        print("sleeping")
        time.sleep(float(os.environ["PROBE_SLEEP"]))
    sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
    """
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ForkServer]:
    (tmp_path / "fs_probe.py").write_text(PROBE)
    env = {**os.environ, "ONLY_IN_SERVER": "server"}
    fork_server = ForkServer(tmp_path, env, preload=("json",))
    yield fork_server
    fork_server.close()


def _env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items()} | extra


def test_a_child_runs_the_module_as_main_with_the_requests_env_cwd_and_log(server: ForkServer, tmp_path: Path) -> None:
    log = tmp_path / "probe.log"
    child = server.spawn("fs_probe", env=_env(PROBE_VALUE="mine", PROBE_EXIT="3"), log_path=log)
    assert child.wait(30) == 3
    lines = log.read_text().splitlines()
    assert "argv0 fs_probe.py name __main__" in lines
    assert f"cwd {tmp_path.resolve()}" in lines
    # Exactly the request's environment: nothing of the server's own is left over.
    assert "env mine None" in lines
    assert "unbuffered 1" in lines


def test_signals_reach_the_child_and_its_exit_code_says_which(server: ForkServer, tmp_path: Path) -> None:
    log = tmp_path / "sleeper.log"
    killed = server.spawn("fs_probe", env=_env(PROBE_SLEEP="60"), log_path=log)
    termed = server.spawn("fs_probe", env=_env(PROBE_SLEEP="60"), log_path=tmp_path / "termed.log")
    deadline = time.monotonic() + 30
    while "sleeping" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert killed.poll() is None and termed.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        killed.wait(0.2)
    killed.kill()
    termed.terminate()
    assert killed.wait(30) == -signal.SIGKILL
    assert termed.wait(30) == -signal.SIGTERM
    killed.kill()  # a reaped pid is never signalled again: it may be another process's by now


def test_an_uncaught_error_exits_1_with_its_traceback_in_the_log(server: ForkServer, tmp_path: Path) -> None:
    (tmp_path / "fs_broken.py").write_text("raise RuntimeError('broken at import')\n")
    log = tmp_path / "broken.log"
    assert server.spawn("fs_broken", env=_env(), log_path=log).wait(30) == 1
    assert "RuntimeError: broken at import" in log.read_text()


def test_it_serves_only_what_a_fork_reproduces(server: ForkServer, tmp_path: Path) -> None:
    assert server.serves(env=_env(), cwd=tmp_path, python_args=())
    assert server.serves(env=_env(PYTHONUNBUFFERED="1"), cwd=tmp_path, python_args=())
    assert not server.serves(env=_env(), cwd=tmp_path, python_args=("-X", "importtime"))
    assert not server.serves(env=_env(), cwd=tmp_path / "elsewhere", python_args=())
    assert not server.serves(env=_env(PYTHONHASHSEED="1"), cwd=tmp_path, python_args=())


def test_the_servers_interpreter_is_this_one(server: ForkServer, tmp_path: Path) -> None:
    (tmp_path / "fs_exe.py").write_text("import sys; print(sys.executable)\n")
    log = tmp_path / "exe.log"
    assert server.spawn("fs_exe", env=_env(), log_path=log).wait(30) == 0
    assert log.read_text().strip() == sys.executable


def _environment_reads_at_import(path: Path) -> list[int]:
    """Lines of `path` that read os.environ / os.getenv outside every function body: run at import."""
    found: list[int] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        is_os = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
        if is_os and node.attr in ("environ", "getenv"):  # type: ignore[attr-defined]
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def test_no_service_or_library_module_reads_the_environment_at_import() -> None:
    """The fork server imports the services' modules once, with its own environment: a value read at
    import would be the server's in every child, not the child's (LLMBUS_CACHE was, and an autoscaler's
    workers wrote their pid files to the wrong directory). Read settings when they are used."""
    repo = Path(__file__).resolve().parents[2]
    offenders = {
        str(path.relative_to(repo)): lines
        for root in ("libs/common/llmbus", "services")
        for path in sorted((repo / root).rglob("*.py"))
        if (lines := _environment_reads_at_import(path))
    }
    assert offenders == {}
