"""llmbus.process.started: a process's start from the kernel's record, right for a forked child too (a
module-level clock would give it the time its parent imported the module)."""

from __future__ import annotations

import os
import time

from llmbus.process import started


def test_a_forked_child_starts_at_its_fork_not_at_its_parents_start() -> None:
    parent = started.of_this_process()
    time.sleep(0.2)
    read, write = os.pipe()
    before_ms = time.time_ns() // 1_000_000
    pid = os.fork()
    if pid == 0:  # the child: its own start, sent back
        os.write(write, str(started.of_this_process().wall_ms).encode())
        os._exit(0)
    os.close(write)
    child_ms = int(os.read(read, 64))
    os.close(read)
    os.waitpid(pid, 0)
    after_ms = time.time_ns() // 1_000_000
    assert parent.wall_ms < before_ms - 150  # the parent is older than the sleep
    assert before_ms - 30 <= child_ms <= after_ms + 30  # clock ticks are 10 ms


def test_the_start_is_in_the_past_on_both_clocks() -> None:
    start, now = started.of_this_process(), started.now()
    assert start.monotonic <= now.monotonic and start.wall_ms <= now.wall_ms
    assert abs((now.monotonic - start.monotonic) * 1000 - (now.wall_ms - start.wall_ms)) < 30
