"""`llmbus plan` / `llmbus costs` / `llmbus router retrain` run their offline tool's entry point, arguments as given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmbus.process.launch import checkout_pythonpath

pytestmark = pytest.mark.slow  # two interpreters per command

REPO = Path(__file__).resolve().parents[2]


def llmbus(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": checkout_pythonpath(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "llmbus.cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_plan_runs_the_planner_with_its_options(tmp_path: Path) -> None:
    done = llmbus("plan", "--peak-factor", "3", "--out", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "plan_case_study.json").read_text())
    assert report["inputs"]["peak_factor"] == 3


def test_a_tool_s_refusal_is_the_command_s_exit_status(tmp_path: Path) -> None:
    done = llmbus("costs", "--no-such-option", cwd=tmp_path)
    assert done.returncode == 2 and "no-such-option" in done.stderr  # typer's usage error, from the tool


def test_help_is_the_tool_s(tmp_path: Path) -> None:
    done = llmbus("router", "retrain", "--help", cwd=tmp_path)
    assert done.returncode == 0 and "--from-bus" in done.stdout
