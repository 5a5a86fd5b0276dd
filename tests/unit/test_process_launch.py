"""llmbus.process.launch: the child gets exactly the environment given, its output goes to the log."""

from __future__ import annotations

from pathlib import Path

from llmbus.process.launch import bus_env, spawn_module
from llmbus.settings import BusSettings


def test_a_child_runs_the_module_with_the_bus_env_and_appends_to_its_log(tmp_path: Path) -> None:
    (tmp_path / "probe_env.py").write_text(
        "import os, sys\n"
        "print(os.environ['LLMBUS_TOPIC_PREFIX'], os.environ['PYTHONUNBUFFERED'], os.environ.get('HOME', '-'))\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    log_path = tmp_path / "probe.log"
    log_path.write_text("earlier run\n")
    env = bus_env(BusSettings(topic_prefix="probe.")) | {"PATH": "/usr/bin:/bin"}
    child = spawn_module("probe_env", env=env, log_path=log_path, cwd=tmp_path)
    assert child.wait(timeout=60) == 0
    lines = log_path.read_text().splitlines()
    # HOME was not passed: the child sees only what it was given (plus PYTHONUNBUFFERED)
    assert lines == ["earlier run", "probe. 1 -", "to stderr"]
