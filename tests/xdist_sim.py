"""Estimate `make test`'s wall time from measured durations: the suite's groups and order as
tests/xdist_groups.py makes them, scheduled onto N workers the way xdist's LoadScopeScheduling hands
out scopes (a worker gets another scope when two or fewer of its tests are pending).

    python -m tests.xdist_sim DURATIONS [--workers 2 3 4] [-- pytest args]

DURATIONS is the output of `pytest --durations=0 -vv` (lines `12.34s call  tests/...::test`); a test
missing from it counts 0 s. It prints, per worker count, the estimated wall time and each worker's
chain of groups. It models no CPU contention: the measured durations already include the load of
the run they came from.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import xdist_groups

DURATION_LINE = re.compile(r"^\s*([\d.]+)s\s+(setup|call|teardown)\s+(\S+)")
MAKE_TEST_MARKS = "not reliability and not long and not analytics"


def read_durations(path: Path) -> dict[str, float]:
    """Per test: setup + call + teardown seconds."""
    totals: dict[str, float] = defaultdict(float)
    for line in path.read_text().splitlines():
        if match := DURATION_LINE.match(line):
            totals[match.group(3)] += float(match.group(1))
    return dict(totals)


class _Collector:
    """A plugin that keeps the collection in xdist_groups' order with each test's group."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.groups: dict[str, str] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        self.groups = {item.nodeid: group for item in items if (group := xdist_groups.group_of(item)) is not None}
        xdist_groups.join_engine_groups(items, self.groups)
        items.sort(key=lambda item: xdist_groups.start_rank(item, self.groups.get(item.nodeid)))
        self.order = [item.nodeid for item in items]


def collect(pytest_args: list[str]) -> _Collector:
    collector = _Collector()
    args = ["--collect-only", "-q", "-p", "no:cacheprovider", "-m", MAKE_TEST_MARKS, *pytest_args]
    code = pytest.main(args, plugins=[collector])
    if code not in (0, 5):
        raise SystemExit(f"collection failed ({code})")
    return collector


@dataclass
class Worker:
    name: str
    pending: list[str] = field(default_factory=list)
    clock_s: float = 0.0
    scopes: list[tuple[str, float]] = field(default_factory=list)


def scopes_in_order(order: list[str], groups: dict[str, str]) -> dict[str, list[str]]:
    scopes: dict[str, list[str]] = {}
    for nodeid in order:
        scopes.setdefault(groups.get(nodeid, nodeid), []).append(nodeid)
    return scopes


def simulate(scopes: dict[str, list[str]], durations: dict[str, float], workers: int) -> list[Worker]:
    """Each worker runs its pending tests in order; whenever it has two or fewer pending, it takes the next
    scope from the queue (at the start: one scope each, then topped up the same way)."""
    queue = list(scopes.items())
    pool = [Worker(f"gw{i}") for i in range(workers)]

    def top_up(worker: Worker) -> None:
        while queue and len(worker.pending) <= 2:
            name, nodeids = queue.pop(0)
            worker.pending.extend(nodeids)
            worker.scopes.append((name, sum(durations.get(n, 0.0) for n in nodeids)))

    for worker in pool:
        if queue:
            name, nodeids = queue.pop(0)
            worker.pending.extend(nodeids)
            worker.scopes.append((name, sum(durations.get(n, 0.0) for n in nodeids)))
    for worker in pool:
        top_up(worker)
    while any(w.pending for w in pool):
        worker = min((w for w in pool if w.pending), key=lambda w: w.clock_s)
        worker.clock_s += durations.get(worker.pending.pop(0), 0.0)
        top_up(worker)
    return pool


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("durations", type=Path)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--top", type=int, default=6, help="scopes shown per worker (longest first)")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    durations = read_durations(args.durations)
    collector = collect(args.pytest_args)
    scopes = scopes_in_order(collector.order, collector.groups)
    total = sum(durations.get(n, 0.0) for n in collector.order)
    print(f"\n{len(collector.order)} tests in {len(scopes)} scopes, {total:.0f} s of measured test time")
    for workers in args.workers:
        pool = simulate(scopes, durations, workers)
        print(f"\n-n {workers}: estimated wall {max(w.clock_s for w in pool):.0f} s (ideal {total / workers:.0f} s)")
        for worker in pool:
            longest = sorted(worker.scopes, key=lambda s: -s[1])[: args.top]
            chain = ", ".join(f"{name.removeprefix('tests/')} {seconds:.0f}s" for name, seconds in longest)
            print(f"  {worker.name}: {worker.clock_s:.0f} s, {len(worker.scopes)} scopes; longest: {chain}")


if __name__ == "__main__":
    sys.exit(main())
