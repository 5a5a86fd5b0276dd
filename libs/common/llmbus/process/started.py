"""When this process started, from the kernel's record of it rather than from an import.

A module-level `time.monotonic()` says when the module was imported: in a process forked from one that
imported it long before (a fork server, a preforking launcher) that is the parent's time, not this
process's. /proc/self/stat keeps the start in clock ticks since boot (10 ms); elsewhere the first
call's time stands in.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Start:
    monotonic: float  # time.monotonic() at the start: durations since it
    wall_ms: int  # the same instant on the wall clock (ms since the epoch): compared with other hosts' times


def now() -> Start:
    return Start(time.monotonic(), time.time_ns() // 1_000_000)


def of_this_process() -> Start:
    """This process's start (fork or exec), or now where the kernel does not say."""
    stamp = now()
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 is fields[0]
        started_since_boot_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        age_s = max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started_since_boot_s)
    except (OSError, ValueError, IndexError, AttributeError):
        return stamp
    return Start(stamp.monotonic - age_s, stamp.wall_ms - round(age_s * 1000))
