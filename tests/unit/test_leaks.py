"""The session-finish check that fails a run which left a private server running (tests/leaks.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil

from tests.leaks import leftovers


def test_a_process_in_the_session_directory_is_found_until_it_ends(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path)
    try:
        name = psutil.Process(proc.pid).name()  # Popen returns after the exec: the interpreter's name
        assert [p.pid for p in leftovers(tmp_path, {name})] == [proc.pid]
        assert leftovers(tmp_path / "elsewhere", {name}) == []
        assert leftovers(Path(str(tmp_path)[:-1]), {name}) == []  # a sibling whose name it starts
        assert leftovers(tmp_path, {"redis-server"}) == []
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert leftovers(tmp_path, {name}) == []
