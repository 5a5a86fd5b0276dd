"""CPU-time profiles of a service process: where its CPU goes, per function, across asyncio tasks.

Set `LLMBUS_CPU_PROFILE=<directory>` and each service started with it writes
`<directory>/<service>-<pid>.pstat` when it exits (read one with `python -m pstats <file>`).

A window of a run instead of the whole of it (a benchmark's load at one concurrency, without the
start-up): SIGUSR1 starts a window (what was counted so far is dropped), SIGUSR2 ends it and
writes `<directory>/<service>-<pid>.window-<n>.pstat` (n = 1, 2, ...); counting goes on from zero
after each window, so the profile written at exit covers what came after the last one.

Why not py-spy: a wall-clock sampler blames whatever a process was running when it lost the
CPU. Under load each socket write wakes the process on the other end, which then runs in
its place, so py-spy showed about a third of every service in `StreamWriter.write` while
/proc said those services spent 90 % of their CPU time in user space (the interpreter).
yappi with its CPU clock counts only time on a CPU. It slows a service about fourfold while
on: it tells where the time goes, not how much there is (measure that with it off).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

WINDOW_START = signal.SIGUSR1
WINDOW_END = signal.SIGUSR2


def window_profile_path(directory: str | Path, service: str, pid: int, window: int) -> Path:
    """Where window `window` (from 1) of a process's profile is written."""
    return Path(directory) / f"{service}-{pid}.window-{window}.pstat"


class _Windows:
    """SIGUSR1 / SIGUSR2 handlers that cut the running yappi profile into windows."""

    def __init__(self, yappi: Any, directory: Path, service: str) -> None:
        self.yappi, self.directory, self.service = yappi, directory, service
        self.written = 0

    def start(self, signum: int, frame: FrameType | None) -> None:
        self.yappi.stop()
        self.yappi.clear_stats()
        self.yappi.start(builtins=True, profile_threads=False)

    def end(self, signum: int, frame: FrameType | None) -> None:
        self.yappi.stop()
        self.written += 1
        path = window_profile_path(self.directory, self.service, os.getpid(), self.written)
        # Written under a temporary name and renamed: a reader polling for the file never sees half of it.
        partial = path.with_suffix(".partial")
        self.yappi.get_func_stats().save(str(partial), type="pstat")
        partial.rename(path)
        self.yappi.clear_stats()
        self.yappi.start(builtins=True, profile_threads=False)


@contextmanager
def cpu_profiled(directory: str | None, service: str) -> Iterator[None]:
    """Profile the calling thread (the event loop's) by CPU time while inside; pstats into `directory`."""
    if not directory:
        yield
        return
    import yappi  # a bench/dev dependency: only profiling needs it

    Path(directory).mkdir(parents=True, exist_ok=True)
    path = Path(directory) / f"{service}-{os.getpid()}.pstat"
    yappi.set_clock_type("cpu")
    yappi.start(builtins=True, profile_threads=False)
    windows = _Windows(yappi, Path(directory), service)
    previous = {
        WINDOW_START: signal.signal(WINDOW_START, windows.start),
        WINDOW_END: signal.signal(WINDOW_END, windows.end),
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        yappi.stop()
        yappi.get_func_stats().save(str(path), type="pstat")
        yappi.clear_stats()
