"""CPU-time profiles of a service process: where its CPU goes, per function, across asyncio tasks.

Set `LLMBUS_CPU_PROFILE=<file>` and the service writes a pstats file there when it exits
(read it with `python -m pstats <file>`, or `bench/reports/pipeline_profile.md`'s recipe).

Why not py-spy: a wall-clock sampler blames whatever a process was running when it lost the
CPU. Under load each socket write wakes the process on the other end, which then runs in
its place, so py-spy showed about a third of every service in `StreamWriter.write` while
/proc said those services spent 90 % of their CPU time in user space (the interpreter).
yappi with its CPU clock counts only time on a CPU. It slows a service about fourfold while
on: it tells where the time goes, not how much there is (measure that with it off).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cpu_profiled(path: str | None) -> Iterator[None]:
    """Profile the calling thread (the event loop's) by CPU time while inside; pstats to `path`."""
    if not path:
        yield
        return
    import yappi  # a bench/dev dependency: only profiling needs it

    yappi.set_clock_type("cpu")
    yappi.start(builtins=True, profile_threads=False)
    try:
        yield
    finally:
        yappi.stop()
        yappi.get_func_stats().save(path, type="pstat")
