"""The cost benchmark's report: Markdown table and PNG from its JSON (bench/cost_bench.py)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any


def _load_range(service: dict[str, Any] | None) -> str:
    loads = [r["load_1m_at_start"] for runs in (service or {}).get("runs", {}).values() for r in runs]
    return f"{min(loads):.1f}-{max(loads):.1f}" if loads else "n/a"


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["service"]["runs"]
    names = ["baseline", "current"]
    cpu = [_median([r["cpu_us_per_result"] for r in runs[name]]) for name in names]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    bars = ax.barh(
        ["service, old code", "service, this code", "core path (no I/O)"], [*cpu, report["core"]["cpu_us_per_result"]]
    )
    ax.bar_label(bars, fmt="%.0f µs")
    ax.axvline(50, color="red", linestyle="--", label="20,000 results/s on one core (50 µs)")
    ax.set_xlabel("CPU µs per result (median of rounds; this process only)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(report: dict[str, Any]) -> list[str]:
    core, service = report["core"], report["service"]
    one_core = 1e6 / core["cpu_us_per_result"]
    lines = [
        "# cost-accounting throughput (one core)",
        "",
        f"Command: `{report['command']}`. Mix: 55 % hosted, 25 % self-hosted on 4 workers, 12 % cache hits, "
        "5 % shadow, 3 % refused. Target: >= 20,000 results/s on one core when replaying a backlog.",
        "",
        "Results/s on one core = 1e6 / CPU µs per result of the process doing the work (what one core "
        "would sustain if it did only this); wall results/s are on a shared 2-core machine and only indicative.",
        "",
        "| path | code | runs | results | wall results/s | CPU µs/result | of which start-up | results/s on one core "
        "| Redis server CPU µs/result |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| core (decode, price / GPU ledger, encode; no I/O) | current | 1 | {core['results']:,} | "
        f"{core['results_per_s']:,.0f} | {core['cpu_us_per_result']:.1f} | - | {one_core:,.0f} | - |",
    ]
    met = {"core": one_core >= 20_000}
    if service:
        for name in ("baseline", "current"):
            runs = service["runs"].get(name)
            if not runs:
                continue
            cpu_us = _median([r["cpu_us_per_result"] for r in runs])
            start_us = _median([r["start_cpu_s"] / r["results"] * 1e6 for r in runs])
            redis_us = _median([r.get("redis_cpu_us_per_result", float("nan")) for r in runs])
            wall = _median([r["results_per_s"] for r in runs])
            label = f"old ({service.get('baseline_ref')})" if name == "baseline" else "current"
            lines.append(
                f"| service (real Kafka + Redis: backlog to billed aggregates) | {label} | {len(runs)} | "
                f"{runs[0]['results']:,} | {wall:,.0f} | {cpu_us:.1f} | {start_us:.1f} | {1e6 / cpu_us:,.0f} "
                f"| {redis_us:.1f} |"
            )
            met[name] = 1e6 / cpu_us >= 20_000
        if "baseline" in service["runs"]:
            old = _median([r["cpu_us_per_result"] for r in service["runs"]["baseline"]])
            new = _median([r["cpu_us_per_result"] for r in service["runs"]["current"]])
            lines += [
                "",
                f"CPU per result, old / current service code, medians of alternating rounds: {old / new:.1f}x.",
            ]
    load1, load5 = report["load_average_1m_5m"]
    lines += [
        "",
        "CPU columns are the measuring process only: Kafka's and Redis's own CPU is not in them (the last column "
        "is the shared Redis server's CPU over the run, other clients' included: indicative only); 'of which "
        "start-up' is the CPU until the service's start() returned (connecting, reading the heartbeat and price "
        "book tables), per result. The service runs end to end: every result read, deduplicated in Redis, priced, "
        "its CostRecord staged in the outbox, published to llm.costs and applied to the aggregates atomically "
        "with its marker, budgets checked (the old code published to llm.costs, read the records back in a "
        "second consumer group and applied them from there). Machine: 2 cores shared by the broker, Redis and "
        f"other work (load average over 1 min at the start of the service runs: {_load_range(service)}; "
        f"{load1:.1f} over 1 min, {load5:.1f} over 5 min when the run ended). A reference pure-Python loop, "
        f"`sum(range(10_000_000))`, took {report['reference_loop_cpu_s']:.2f} CPU-s here: scale by that loop's "
        "time on your machine to compare.",
        "",
        f"Target >= 20,000 results/s on one core: core path {'met' if met['core'] else 'NOT met'}; "
        f"service {'met' if met.get('current') else 'NOT met'} (current code).",
    ]
    return lines
