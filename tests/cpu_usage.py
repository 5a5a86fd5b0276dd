"""Where `make test`'s CPU goes: a pytest plugin that records each test's CPU-seconds, and its summary.

On two cores the suite is bound by CPU, not by waiting: the wall time can only fall as far as the CPU
it burns allows (busy CPU-seconds / 2 cores). This plugin writes, per test, the CPU-seconds of the
xdist worker (user + system) and of the child processes that exited during the test (CLI runs and
private brokers it reaped; services started with ServiceProc, whose CPU the fork server reports), and
the processes it launched:

    make test PYTEST_ARGS="-p tests.cpu_usage"     # rows in $LLMBUS_TEST_CPU_DIR (default /tmp/llmbus-test-cpu)
    python -m tests.cpu_usage [DIR] [--top 30]     # per module: CPU-s, wall, service processes started

A child's CPU is counted when it is reaped, so a process a module-scoped fixture started counts at the
module's last test. The shared broker and Redis are not children of any worker: read their CPU from
/proc (`ps -o times= -p PID`) before and after the run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from llmbus_tools.harness import forkserver

DIR_ENV = "LLMBUS_TEST_CPU_DIR"
DEFAULT_DIR = "/tmp/llmbus-test-cpu"

_OUT = pytest.StashKey[Any]()
_launched: list[str] = []
_popen_init = subprocess.Popen.__init__


def _recording_init(self: subprocess.Popen[Any], args: Any, *more: Any, **kw: Any) -> None:
    argv = [args] if isinstance(args, (str, bytes)) else list(args)
    _launched.append(" ".join(str(a) for a in argv[:3]))
    _popen_init(self, args, *more, **kw)


def _cpu_s() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    server = forkserver.current()
    if server is not None:  # its children are reaped by the fork server, which reports their CPU
        server.collect(0)
    forked = server.reaped_cpu_s if server is not None else 0.0
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime + forked


def _forked() -> list[str]:
    server = forkserver.current()
    return server.spawned if server is not None else []


def pytest_configure(config: pytest.Config) -> None:
    subprocess.Popen.__init__ = _recording_init  # type: ignore[method-assign]
    out_dir = Path(os.environ.get(DIR_ENV, DEFAULT_DIR))
    out_dir.mkdir(parents=True, exist_ok=True)
    config.stash[_OUT] = (out_dir / f"rows-{os.getpid()}.jsonl").open("a")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    launched_before, forked_before = len(_launched), len(_forked())
    (own0, children0), started = _cpu_s(), time.monotonic()
    yield
    own1, children1 = _cpu_s()
    row = {
        "test": item.nodeid,
        "wall_s": round(time.monotonic() - started, 3),
        "cpu_s": round(own1 - own0, 3),
        "children_cpu_s": round(children1 - children0, 3),
        "launched": _launched[launched_before:] + _forked()[forked_before:],
    }
    out = item.config.stash[_OUT]
    out.write(json.dumps(row) + "\n")
    out.flush()


def summarize(rows: list[dict[str, Any]], top: int) -> str:
    per_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for row in rows:
        module = per_module[row["test"].split("::", 1)[0]]
        module[0] += row["cpu_s"] + row["children_cpu_s"]
        module[1] += row["wall_s"]
        module[2] += sum(1 for argv in row["launched"] if "llmbus_services." in argv)
    total = sum(m[0] for m in per_module.values())
    lines = [f"{len(rows)} tests, {total:.0f} CPU-s in the test workers and their children", ""]
    lines.append(f"{'CPU-s':>7} {'wall-s':>7} {'services':>8}  module")
    for name, (cpu, wall, services) in sorted(per_module.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{cpu:7.1f} {wall:7.1f} {int(services):8d}  {name}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", nargs="?", default=os.environ.get(DIR_ENV, DEFAULT_DIR))
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    rows = [json.loads(line) for path in sorted(Path(args.dir).glob("rows-*.jsonl")) for line in path.open()]
    print(summarize(rows, args.top))


if __name__ == "__main__":
    main()
