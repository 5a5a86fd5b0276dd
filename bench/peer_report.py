"""Rows, comparisons and reports of the peer benchmark: JSON, Markdown and a PNG.

A row is one (target, driver, concurrency) point. The comparisons are ratios within the run:
first token added over the upstream called directly (p50 minus the direct p50 at the same
concurrency, same driver), requests/s against TensorZero's and the upstream's, and the issue's
targets judged on the project driver's rows, where CPU per request is measured too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench.peer_load import Sample
from bench.pipeline_queued import percentiles

DIRECT = "upstream direct"
TENSORZERO = "TensorZero"
NOT_CONTROL_PLANE = ("upstream", "driver")  # measured beside every target, not part of its cost


def summarise_point(
    target: str, concurrency: int, samples: list[Sample], elapsed_s: float, window: dict[str, object]
) -> dict[str, object]:
    """A project-driver row: rates and percentiles from the samples, CPU per request from the window."""
    ok = [s for s in samples if s.error is None]
    errors: dict[str, int] = {}
    for s in samples:
        if s.error is not None:
            errors[s.error] = errors.get(s.error, 0) + 1
    cpu_s: dict[str, float] = window["cpu_s"]  # type: ignore[assignment]
    n = max(1, len(samples))
    cpu_ms = {role: round(1000 * s / n, 3) for role, s in cpu_s.items() if not math.isnan(s)}
    window_s = float(window["elapsed_s"])  # type: ignore[arg-type]
    ours_s = sum(s for s in cpu_s.values() if not math.isnan(s))
    machine_s = float(window.get("machine_busy_s", ours_s))  # type: ignore[arg-type]
    loadavg: list[tuple[float, float, float]] = window["loadavg"]  # type: ignore[assignment]
    return {
        "target": target,
        "driver": "own",
        "concurrency": concurrency,
        "requests": len(samples),
        "requests_per_s": round(len(samples) / elapsed_s, 1),
        "first_token_ms": percentiles([s.first_token_ms for s in ok if s.first_token_ms is not None], (50, 99), 2),
        "final_ms": percentiles([s.final_ms for s in ok if s.final_ms is not None], (50, 99), 2),
        "errors": len(samples) - len(ok),
        "error_kinds": errors,
        "cpu_ms_per_request": cpu_ms,
        "control_plane_cpu_ms_per_request": round(
            sum(ms for role, ms in cpu_ms.items() if role not in NOT_CONTROL_PLANE), 3
        ),
        "elapsed_s": round(elapsed_s, 2),
        "machine_busy_cores": round(machine_s / window_s, 2),
        "others_busy_cores": round(max(0.0, machine_s - ours_s) / window_s, 2),
        "loadavg_1min": [round(loadavg[0][0], 2), round(loadavg[1][0], 2)],
    }


def _find(rows: list[dict], target: str, driver: str, concurrency: int) -> dict | None:
    for row in rows:
        if row["target"] == target and row["driver"] == driver and row["concurrency"] == concurrency:
            return row
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, 2)


def compare(rows: list[dict]) -> list[dict]:
    """Each row's figures against the upstream called directly and against TensorZero, same driver and c."""
    out = []
    for row in rows:
        if "error" in row or row["driver"] == "idle":
            continue
        direct = _find(rows, DIRECT, row["driver"], row["concurrency"])
        tz = _find(rows, TENSORZERO, row["driver"], row["concurrency"])
        p50 = row["first_token_ms"]["p50"]
        added = None if direct is None or p50 is None else round(p50 - direct["first_token_ms"]["p50"], 2)
        tz_added = None
        if tz is not None and direct is not None and tz["first_token_ms"]["p50"] is not None:
            tz_added = round(tz["first_token_ms"]["p50"] - direct["first_token_ms"]["p50"], 2)
        out.append(
            {
                "target": row["target"],
                "driver": row["driver"],
                "concurrency": row["concurrency"],
                "first_token_added_ms": added,
                "first_token_added_vs_tensorzero": _ratio(added, tz_added),
                "requests_per_s_vs_tensorzero": _ratio(row["requests_per_s"], tz and tz["requests_per_s"]),
                "requests_per_s_vs_upstream": _ratio(row["requests_per_s"], direct and direct["requests_per_s"]),
            }
        )
    return out


def verdicts(rows: list[dict], comparisons: list[dict], llmbus: str, baseline: str | None) -> list[dict]:
    """The issue's targets, on the project driver's rows: figure, bound, met or not."""
    own = [c for c in comparisons if c["driver"] == "own"]

    def cmp(target: str, concurrency: int) -> dict:
        return next((c for c in own if c["target"] == target and c["concurrency"] == concurrency), {})

    def row(target: str, concurrency: int) -> dict:
        return _find(rows, target, "own", concurrency) or {}

    checks = []
    added = cmp(llmbus, 1).get("first_token_added_vs_tensorzero")
    checks.append(("c=1: first token added over direct ≤ 3 x TensorZero's", added, 3.0, "≤"))
    checks.append(("c=64: req/s ≥ 0.5 x TensorZero's", cmp(llmbus, 64).get("requests_per_s_vs_tensorzero"), 0.5, "≥"))
    checks.append(("c=64: req/s ≥ 0.35 x the upstream's", cmp(llmbus, 64).get("requests_per_s_vs_upstream"), 0.35, "≥"))
    litellm = next((r["target"] for r in rows if r["target"].startswith("LiteLLM")), None)
    ours, theirs = (
        row(llmbus, 64).get("final_ms", {}).get("p99"),
        litellm and row(litellm, 64).get("final_ms", {}).get("p99"),
    )
    checks.append(("c=64: final p99 below LiteLLM's (ms, ratio)", _ratio(ours, theirs), 1.0, "<"))
    errors = sum(r.get("errors", 0) for r in rows if r["target"] == llmbus)
    checks.append(("no errors (every point, both drivers)", float(errors), 0.0, "≤"))
    if baseline is not None:
        now, before = (row(name, 64).get("control_plane_cpu_ms_per_request") for name in (llmbus, baseline))
        checks.append(("c=64: control-plane CPU per request ≤ ⅓ of the baseline's", _ratio(now, before), 1 / 3, "≤"))
    out = []
    for name, value, bound, op in checks:
        met = None
        if value is not None:
            met = {"≤": value <= bound, "≥": value >= bound, "<": value < bound}[op]
        out.append({"target": name, "value": value, "bound": f"{op} {bound:.2f}", "met": met})
    return out


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def _main_table(rows: list[dict], comparisons: list[dict], driver: str) -> list[str]:
    lines = [
        "| target | c | req/s | first token p50 (added over direct) | first token p99 | final p50 | final p99 "
        "| errors | req/s vs TensorZero | req/s vs upstream |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["driver"] != driver or "error" in row:
            continue
        c = next(
            x
            for x in comparisons
            if x["target"] == row["target"] and x["driver"] == driver and x["concurrency"] == row["concurrency"]
        )
        added = c["first_token_added_ms"]
        first = f"{_cell(row['first_token_ms']['p50'])} ms" + (f" (+{_cell(added)})" if added is not None else "")
        capped = " (capped)" if row.get("capped") else ""
        lines.append(
            f"| {row['target']} | {row['concurrency']} | {_cell(row['requests_per_s'])}{capped} | {first} "
            f"| {_cell(row['first_token_ms']['p99'])} | {_cell(row['final_ms']['p50'])} "
            f"| {_cell(row['final_ms']['p99'])} | {row['errors']} "
            f"| {_cell(c['requests_per_s_vs_tensorzero'])} | {_cell(c['requests_per_s_vs_upstream'])} |"
        )
    return lines


def _cpu_table(rows: list[dict]) -> list[str]:
    roles: list[str] = []
    for row in rows:
        for role in row.get("cpu_ms_per_request", {}):
            if role not in roles:
                roles.append(role)
    lines = [
        "| target | c | "
        + " | ".join(roles)
        + " | control plane | machine busy (cores) | others (cores) | load 1 min |",
        "|---|---|" + "---|" * (len(roles) + 4),
    ]
    for row in rows:
        if row["driver"] != "own":
            continue
        cells = [_cell(row["cpu_ms_per_request"].get(role)) for role in roles]
        lines.append(
            f"| {row['target']} | {row['concurrency']} | "
            + " | ".join(cells)
            + f" | **{_cell(row['control_plane_cpu_ms_per_request'])}** | {row['machine_busy_cores']} "
            f"| {row['others_busy_cores']} | {row['loadavg_1min'][0]} → {row['loadavg_1min'][1]} |"
        )
    return lines


def closing_lines(report: dict, paths_heading: str, png_name: str, alt: str) -> list[str]:
    """The paths measured, every version, and the plot: how each report of this family ends."""
    lines = [f"## {paths_heading}", "", *[f"- {n}" for n in report["notes"]], ""]
    lines += ["## Versions", "", "| what | version |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in report["versions"].items()]
    return [*lines, "", f"![{alt}]({png_name})", ""]


def markdown(report: dict, png_name: str = "peer.png") -> str:
    rows, comparisons = report["rows"], report["comparisons"]
    lines = [
        "# Peer benchmark: llmbus against TensorZero, LiteLLM and the upstream itself",
        "",
        f"Command: `{report['command']}`  ",
        f"Run: {report['started']} → {report['finished']}; machine: {report['machine']}  ",
        f"Load average (1, 5, 15 min) at the start: {report['loadavg_start']}, at the end: {report['loadavg_end']}",
        "",
        "The same zero-cost streaming OpenAI-compatible upstream (`bench/peer_upstream.py`) behind every "
        f"path, {report['tokens']}-token answers, {report['requests']} requests per point, closed loop at each "
        "concurrency c, one path at a time. First token = first SSE event with text; final = end of the response. "
        "Ratios are within this run. CPU per request: process CPU time (user + system, children included) over "
        "the project driver's window divided by its requests.",
        "",
    ]
    if report.get("warnings"):
        lines += ["**Read with care:**", "", *[f"- {w}" for w in report["warnings"]], ""]
    lines += ["## The issue's targets (project driver)", "", "| target | measured | bound | met |", "|---|---|---|---|"]
    for v in report["verdicts"]:
        met = {True: "yes", False: "**no**", None: "-"}[v["met"]]
        lines.append(f"| {v['target']} | {_cell(v['value'])} | {v['bound']} | {met} |")
    lines += ["", "## Project driver (`bench/peer_load.py`)", "", *_main_table(rows, comparisons, "own"), ""]
    if any(r["driver"] == "inference-perf" for r in rows):
        lines += [
            f"## inference-perf {report['versions'].get('inference-perf', '')}",
            "",
            *_main_table(rows, comparisons, "inference-perf"),
            "",
            "(capped): within 10 % of what its concurrent mode can show at all (N requests/s: it enqueues a "
            "stage over one second).",
            "",
        ]
    lines += ["## CPU per request (ms), project driver's window", "", *_cpu_table(rows), ""]
    carried = [r for r in rows if "kafka_records_per_request" in r]
    if carried:
        lines += ["## What llmbus carried per request (project driver's window)", ""]
        for r in carried:
            records = r["kafka_records_per_request"]
            commands = r["redis_commands_per_request"]
            lines.append(
                f"- {r['target']}, c={r['concurrency']}: {sum(records.values()):.1f} Kafka records {records}; "
                f"{sum(commands.values()):.1f} Redis commands {commands}"
            )
        lines.append("")
    idle = [r for r in rows if r["driver"] == "idle"]
    if idle:
        lines += ["## Idle CPU (cores: CPU-seconds per second with no requests)", ""]
        lines += [f"- {r['target']}: " + ", ".join(f"{k} {v}" for k, v in r["idle_cores"].items()) for r in idle]
        lines.append("")
    return "\n".join(lines + closing_lines(report, "Paths", png_name, "peer"))


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r["driver"] == "own" and "error" not in r]
    comparisons = [c for c in report["comparisons"] if c["driver"] == "own"]
    targets = list(dict.fromkeys(r["target"] for r in rows))
    levels = sorted({r["concurrency"] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    width = 0.8 / max(1, len(targets))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, target in enumerate(targets):
        xs = [j + i * width for j in range(len(levels))]
        rates = [(_find(rows, target, "own", c) or {}).get("requests_per_s") or 0 for c in levels]
        colour = colours[i % len(colours)]  # one colour per target in both panels
        axes[0].bar(xs, rates, width, label=target, color=colour)
        added = [
            next(
                (x["first_token_added_ms"] for x in comparisons if x["target"] == target and x["concurrency"] == c),
                None,
            )
            for c in levels
        ]
        if target != DIRECT:
            axes[1].bar(xs, [max(a or 0.0, 0.01) for a in added], width, label=target, color=colour)
    for ax, title in ((axes[0], "requests/s"), (axes[1], "first token p50 added over direct (ms, log)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(levels))], [f"c={c}" for c in levels])
        ax.set_title(title)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    llmbus_rows = [r for r in rows if r["target"].startswith("llmbus")]
    bottom = [0.0] * len(llmbus_rows)
    roles = [
        role
        for role in ("gateway", "router", "scheduler", "worker", "broker", "redis")
        if any(role in r["cpu_ms_per_request"] for r in llmbus_rows)
    ]
    labels = [f"{'baseline' if 'baseline' in r['target'] else 'llmbus'}\nc={r['concurrency']}" for r in llmbus_rows]
    for role in roles:
        values = [r["cpu_ms_per_request"].get(role, 0.0) for r in llmbus_rows]
        axes[2].bar(labels, values, bottom=bottom, label=role)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    tz = [r for r in rows if r["target"] == TENSORZERO]
    if tz:
        axes[2].axhline(
            max(r["control_plane_cpu_ms_per_request"] for r in tz), color="k", ls="--", lw=1, label="TensorZero (max)"
        )
    axes[2].set_title("llmbus control-plane CPU per request (ms)")
    axes[2].legend(fontsize=8)
    axes[2].tick_params(axis="x", labelsize=7)
    fig.suptitle(
        f"peer benchmark, {report['tokens']}-token answers, load average at start {report['loadavg_start'][0]}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_reports(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report, out.with_suffix(".png").name))
    plot(report, out.with_suffix(".png"))
