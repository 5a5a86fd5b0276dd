"""llmbus.observability.profiling: a CPU-time profile is written at exit when asked for, nothing otherwise;
SIGUSR1 / SIGUSR2 cut a window out of it."""

from __future__ import annotations

import os
import pstats
import signal
from pathlib import Path

from llmbus.observability.profiling import WINDOW_END, WINDOW_START, cpu_profiled, window_profile_path


def _spin(n: int) -> int:
    return sum(i * i for i in range(n))


def test_the_profile_names_where_cpu_went(tmp_path: Path) -> None:
    with cpu_profiled(str(tmp_path / "out"), "svc"):
        _spin(200_000)
    [path] = (tmp_path / "out").glob("svc-*.pstat")
    stats = pstats.Stats(str(path))
    spent = {name: entry[3] for (_, _, name), entry in stats.stats.items()}  # type: ignore[attr-defined]
    assert spent.get("_spin", 0) > 0


def test_no_path_no_profile(tmp_path: Path) -> None:
    with cpu_profiled(None, "svc"):
        _spin(1000)
    assert not list(tmp_path.iterdir())


def _spin_more(n: int) -> int:
    return sum(i * 3 for i in range(n))


def test_a_window_profiles_only_what_ran_between_its_signals(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with cpu_profiled(str(out), "svc"):
        _spin(200_000)  # before the window: not in it
        os.kill(os.getpid(), WINDOW_START)
        _spin_more(200_000)
        os.kill(os.getpid(), WINDOW_END)
        _spin(1_000)  # after it: in the exit profile only
    window = window_profile_path(out, "svc", os.getpid(), 1)
    assert window.exists() and not list(out.glob("*.partial"))
    in_window = {name for (_, _, name) in pstats.Stats(str(window)).stats}  # type: ignore[attr-defined]
    assert "_spin_more" in in_window and "_spin" not in in_window
    [whole] = out.glob(f"svc-{os.getpid()}.pstat")
    after = {name for (_, _, name) in pstats.Stats(str(whole)).stats}  # type: ignore[attr-defined]
    assert "_spin" in after and "_spin_more" not in after
    # The handlers are put back: outside a profile the signals do what they did before.
    assert signal.getsignal(WINDOW_START) == signal.SIG_DFL and signal.getsignal(WINDOW_END) == signal.SIG_DFL
