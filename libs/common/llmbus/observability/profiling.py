"""CPU-time profiles of a service process: where its CPU goes, per function, across asyncio tasks.

Set `LLMBUS_CPU_PROFILE=<directory>` and each service started with it writes
`<directory>/<service>-<pid>.pstat` when it exits (read one with `python -m pstats <file>`).

Why not py-spy: a wall-clock sampler blames whatever a process was running when it lost the
CPU. Under load each socket write wakes the process on the other end, which then runs in
its place, so py-spy showed about a third of every service in `StreamWriter.write` while
/proc said those services spent 90 % of their CPU time in user space (the interpreter).
yappi with its CPU clock counts only time on a CPU. It slows a service about fourfold while
on: it tells where the time goes, not how much there is (measure that with it off).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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
    try:
        yield
    finally:
        yappi.stop()
        yappi.get_func_stats().save(str(path), type="pstat")
