"""Scale-down under load hands answers over mid-stream: the handover time, measured on the real broker.

    python -m bench.handover_bench                 # writes bench/reports/handover.{json,md}
    python -m bench.handover_bench --requests 600 --runs 3

Each run (llmbus_tools.harness.reliability.handover.scale_down_under_load): router, scheduler, one static sim
worker and a pool of two sim workers that the autoscaler's local actuator starts, all on the local broker and
Redis in a fresh namespace; a load of sampled answers (temperature 0.9, no seed, 60-140 tokens at 0.3x the H100
profile: about two seconds of streaming each); at 35 % of the load the actuator scales the pool to 1, at 70 % to
0 (SIGTERM; the workers' handover grace is --handover-grace-s). Every answer a drained worker had not finished is
handed over mid-stream and continued by another worker.

Measured per handover: the client's wait, from the drained leg's last chunk to the next leg's first chunk (record
timestamps on the reply topic, one machine's clock), and per drained worker the time from SIGTERM to its exit.
Fixed before the run: every run passes its audit (0 lost, 0 doubled, clean chunks, no error results) and the
stream check (every client shown one answer, no error, no restart, each leg exactly its tokens), and at least one
answer is handed over; the wait is reported, not bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from llmbus_tools.harness.reliability.deployment import Deployment
from llmbus_tools.harness.reliability.handover import HandoverRun, scale_down_under_load
from llmbus_tools.harness.reliability.streams import summary
from llmbus_tools.harness.service_procs import fresh_settings

REPORTS = Path(__file__).parent / "reports"


async def runs(args: argparse.Namespace) -> list[HandoverRun]:
    done = []
    for n in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="handover-") as log_dir:
            run = await scale_down_under_load(
                Deployment.plain(fresh_settings()), Path(log_dir), args.requests, args.rate, 180, args.handover_grace_s
            )
        print(f"run {n + 1}: {run.outcome.verdict()}\n  " + "\n  ".join(run.outcome.notes), file=sys.stderr)
        done.append(run)
    return done


def report(done: list[HandoverRun], args: argparse.Namespace, seconds: float) -> dict[str, object]:
    gaps = [gap for run in done for gap in run.gaps_ms]
    drains = [s for run in done for s in run.drain_s.values()]
    return {
        "command": shlex.join(["python", "-m", "bench.handover_bench", *sys.argv[1:]]),
        "requests_per_run": args.requests,
        "rate_per_s": args.rate,
        "handover_grace_s": args.handover_grace_s,
        "runs": [
            {
                "passed": run.outcome.passed,
                "audit": run.outcome.report.counts(),
                "problems": run.outcome.effect_problems,
                "handed_over": run.handed_over,
                "wait_ms": summary(run.gaps_ms),
                "drain_s": run.drain_s,
                "notes": run.outcome.notes,
            }
            for run in done
        ],
        "passed": all(run.outcome.passed for run in done),
        "handed_over": sum(run.handed_over for run in done),
        "wait_ms": summary(gaps),
        "wait_mean_ms": round(statistics.fmean(gaps), 1) if gaps else None,
        "sigterm_to_exit_s": {"n": len(drains), "max": max(drains, default=0.0)},
        "seconds": round(seconds, 1),
    }


def markdown(result: dict[str, object]) -> str:
    wait = result["wait_ms"]
    lines = [
        "# Scale-down hands answers over mid-stream: the handover time",
        "",
        f"Command: `{result['command']}` (bench/handover_bench.py says what a run is and what is measured).",
        "",
        f"- runs: {len(result['runs'])} (each {result['requests_per_run']} sampled requests at "  # type: ignore[arg-type]
        f"{result['rate_per_s']}/s; the pool scaled 2 → 1 → 0 mid-load; handover grace {result['handover_grace_s']} s)",
        f"- passed (fixed before the run: audit, streams, at least one handover): {result['passed']}",
        f"- answers handed over mid-stream and continued elsewhere: {result['handed_over']}",
        f"- the client's wait at a handover (the drained leg's last chunk → the next leg's first), ms: {wait}"
        f" (mean {result['wait_mean_ms']})",
        f"- SIGTERM to exit of each drained worker, s: {result['sigterm_to_exit_s']}",
        f"- took {result['seconds']} s",
        "",
        "| run | passed | handed over | wait ms (n, p50, p90, max) | SIGTERM → exit s |",
        "|---|---|---|---|---|",
    ]
    for n, run in enumerate(result["runs"], start=1):  # type: ignore[arg-type]
        lines.append(f"| {n} | {run['passed']} | {run['handed_over']} | {run['wait_ms']} | {run['drain_s']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--handover-grace-s", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=REPORTS / "handover")
    args = parser.parse_args()
    started = time.monotonic()
    done = asyncio.run(runs(args))
    result = report(done, args, time.monotonic() - started)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
