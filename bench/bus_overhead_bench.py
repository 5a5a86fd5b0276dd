"""CPU cost per record of the bus library, this tree against a baseline commit, side by side in one run.

    python -m bench.bus_overhead_bench            # writes bench/reports/bus_overhead.{json,md}
    python -m bench.bus_overhead_bench --baseline b96105b --calls 20000 --repeats 5 --rounds 3

What every service pays on every record it consumes or produces, outside the broker: the
partition of a keyed record (make_producer's partitioner), the trace headers written
(`headers.outgoing`) and read (`headers.trace_context`), decoding, a record handled by
`ConsumerLoop._handle` with a handler that does nothing, a chunk enqueued by `Publisher.send`
(against a producer that acknowledges at once, and through aiokafka's own producer, never
started) and a result published by `Publisher.publish`. Each side runs in its own process (bench.bus_overhead_probe,
with the baseline's `libs/common` taken from git), tracing off (the default: nothing sampled)
and with every span sampled; sides alternate, round after round, and the figure kept is the
lowest of all repeats (noise on a shared machine only ever adds), the median beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "bench" / "reports"
DEFAULT_BASELINE = "b96105b"
MODES = ("off", "sampled")


def log(msg: str) -> None:
    print(f"[bus_overhead_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def have_commit(commit: str) -> bool:
    found = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
    return found.returncode == 0


def baseline_libs(commit: str, into: Path) -> Path:
    """The baseline commit's `libs/common`, unpacked from git (no worktree, nothing checked out)."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "libs/common"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "libs" / "common"


def probe(libs: Path, mode: str, calls: int, repeats: int) -> dict[str, list[float]]:
    env = {**os.environ, "PYTHONPATH": f"{libs}{os.pathsep}{ROOT}"}
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "LLMBUS_TRACE_FILE"):
        env.pop(name, None)
    command = [sys.executable, "-m", "bench.bus_overhead_probe", "--tracing", mode]
    command += ["--calls", str(calls), "--repeats", str(repeats)]
    out = subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=600)
    result: dict[str, list[float]] = json.loads(out.stdout)
    return result


def measure(
    sides: dict[str, Path], calls: int, repeats: int, rounds: int
) -> dict[str, dict[str, dict[str, list[float]]]]:
    """{mode: {case: {side: every repeat's µs per call}}}, sides alternating within each round."""
    found: dict[str, dict[str, dict[str, list[float]]]] = {mode: {} for mode in MODES}
    for round_no in range(1, rounds + 1):
        for mode in MODES:
            for side, libs in sides.items():
                log(f"round {round_no}/{rounds}: tracing {mode}, {side}")
                for case, timings in probe(libs, mode, calls, repeats).items():
                    found[mode].setdefault(case, {}).setdefault(side, []).extend(timings)
    return found


def summarise(found: dict[str, dict[str, dict[str, list[float]]]]) -> dict[str, list[dict[str, object]]]:
    rows: dict[str, list[dict[str, object]]] = {}
    for mode, cases in found.items():
        rows[mode] = []
        for case, sides in cases.items():
            before, after = min(sides["before"]), min(sides["after"])
            rows[mode].append(
                {
                    "case": case,
                    "before_us": round(before, 2),
                    "after_us": round(after, 2),
                    "before_median_us": round(statistics.median(sides["before"]), 2),
                    "after_median_us": round(statistics.median(sides["after"]), 2),
                    "saved_us": round(before - after, 2),
                    "after_over_before": round(after / before, 2),
                }
            )
    return rows


def markdown(report: dict[str, object]) -> str:
    lines = [
        "# Bus library: CPU per record, before and after",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Baseline: `{report['baseline']}` (its `libs/common`) against this tree; each side in its own process, "
        f"sides alternating, {report['rounds']} rounds x {report['repeats']} repeats x {report['calls']} calls. "
        "µs of CPU (process time) per call: the lowest repeat, the median in brackets. "
        f"Python {report['python']}, uvloop, load average at the start {report['load_average']}.",
        "",
        "No broker: the producer acknowledges at once and the handler does nothing, so these are the bus",
        "library's own fixed costs per record (aiokafka's batching and the broker are not in them).",
        "`ConsumerLoop._handle` includes building the record and `OffsetTracker.started`, as `_start` does.",
        "The fake producer does not partition: with aiokafka's, each keyed send also pays the partitioner",
        "line (make_producer's partitioner; a request's records share its key, so all but its first are",
        "'a key seen before'). 'through aiokafka's producer' is make_producer's real producer, never started",
        "(partitions given in place of metadata, nothing flushed, 8 keys in turn): the library's part plus",
        "aiokafka's enqueue. The `asyncio.timeout` line is the same code on both sides, for scale.",
    ]
    rows = report["rows"]
    assert isinstance(rows, dict)
    for mode, title in (("off", "Tracing off (the default: nothing sampled)"), ("sampled", "Every span sampled")):
        lines += ["", f"## {title}", "", "| per call | before µs | after µs | saved µs | after / before |"]
        lines += ["|---|---:|---:|---:|---:|"]
        for row in rows[mode]:
            lines.append(
                f"| {row['case']} | {row['before_us']} ({row['before_median_us']}) | "
                f"{row['after_us']} ({row['after_median_us']}) | {row['saved_us']} | {row['after_over_before']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="git commit measured as 'before'")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    command = "python -m bench.bus_overhead_bench" + (
        f" --baseline {args.baseline} --calls {args.calls} --repeats {args.repeats} --rounds {args.rounds}"
    )
    if not have_commit(args.baseline):  # a shallow clone: nothing to compare with, the report is left as it is
        log(f"baseline {args.baseline} is not in this clone: nothing measured (fetch it, or pass --baseline)")
        return
    load_average = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="bus-overhead-") as tmp:
        sides = {"before": baseline_libs(args.baseline, Path(tmp)), "after": ROOT / "libs" / "common"}
        found = measure(sides, args.calls, args.repeats, args.rounds)
    report: dict[str, object] = {
        "command": command,
        "baseline": args.baseline,
        "calls": args.calls,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "python": platform.python_version(),
        "load_average": load_average,
        "rows": summarise(found),
        "raw_us": found,
    }
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / "bus_overhead.json").write_text(json.dumps(report, indent=2) + "\n")
    (REPORTS / "bus_overhead.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
