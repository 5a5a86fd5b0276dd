"""The reliability report: scenarios x sent / answered / errors / lost / doubled, the errors each allowed,
billing, and the services' rows, as JSON, Markdown and a PNG."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from llmbus_tools.harness.reliability.service_rows import SIGNALS
from llmbus_tools.harness.reliability.verdict import Outcome

COLUMNS = ("sent", "answered", "errored", "lost", "doubled", "bad_chunks", "misplaced", "unaccounted")
SERVICE_COLUMNS = ("exits", *SIGNALS)


def _verdict(row: dict[str, object]) -> str:
    return "pass" if row["passed"] else ("**did not finish**" if row["error"] else "**FAIL**")


def write_report(outcomes: list[Outcome], path_prefix: Path, command: str, size: str) -> None:
    rows = [o.row() for o in outcomes]
    meta = {
        "command": command,
        "size": size,
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
    }
    path_prefix.parent.mkdir(parents=True, exist_ok=True)
    path_prefix.with_suffix(".json").write_text(json.dumps({**meta, "scenarios": rows}, indent=2) + "\n")
    lines = [
        "# Reliability: delivery under injected faults, as deployed",
        "",
        f"Command: `{command}` ({size} sizes), finished {meta['finished_at']}.",
        "",
        "Each scenario runs the stack as deployed (SASL/SCRAM and the ACLs generated from the contracts, every",
        "service as its own principal with the shipped defaults, cost-accounting in every stack), injects its",
        "fault mid-load, waits for the answers and then audits every topic of its namespace (`llmbus.audit`):",
        "exactly one final result per request (every tenant's, every one judged), the answering attempt's",
        "chunks gap-free and equal to the result's text, nothing on a topic it does not belong on. Answers and",
        "errors are counted apart; an error its scenario did not allow before the run (code, bound, which",
        "requests, why) fails it, and so does billing that is not conserved (every result billed once; Redis's",
        "totals overall, per model and per tenant equal to llm.costs) or another effect not exactly once.",
        "See docs/reliability.md.",
        "",
        "| scenario | " + " | ".join(COLUMNS) + " | error results | seconds | verdict |",
        "|---|" + "---:|" * len(COLUMNS) + "---|---:|---|",
    ]
    for row in rows:
        errors = ", ".join(f"{k} {v}" for k, v in sorted(row["error_results"].items())) or "none"  # type: ignore[union-attr,attr-defined]
        cells = " | ".join(str(row[c]) for c in COLUMNS)
        lines.append(f"| {row['scenario']} | {cells} | {errors} | {row['seconds']} | {_verdict(row)} |")
    lines += ["", "## Errors each scenario allowed (fixed before it ran)", ""]
    for row in rows:
        allowed = "; ".join(row["errors_allowed"])  # type: ignore[arg-type]
        lines.append(f"- **{row['scenario']}**: {allowed}")
    lines += [
        "",
        "## Per scenario and service",
        "",
        "Which check judged each service (the delivery audit for the request path, an effect checker for",
        "the services beside it), and what its log shows it went through: exits by itself (restarted by",
        "the harness), group memberships lost, commits left for a later interval, acks waited for past",
        "send_timeout_s, publishes sent again, producers renewed.",
        "",
        "| scenario | service | judged by | verdict | " + " | ".join(SERVICE_COLUMNS) + " |",
        "|---|---|---|---|" + "---:|" * len(SERVICE_COLUMNS),
    ]
    for row in rows:
        for service in row["services"]:  # type: ignore[attr-defined]
            cells = " | ".join(str(service[c]) for c in SERVICE_COLUMNS)
            verdict = "pass" if service["passed"] else "**FAIL**"
            lines.append(f"| {row['scenario']} | {service['service']} | {service['judged_by']} | {verdict} | {cells} |")
    lines += ["", "## What happened in each scenario", ""]
    for row in rows:
        lines.append(f"### {row['scenario']}")
        if row["error"]:
            lines.append(f"- did not finish: `{str(row['error'])[:300]}`")
        lines.extend(f"- {note}" for note in row["notes"])  # type: ignore[union-attr,attr-defined]
        if row["dead_letters_by"]:
            lines.append(f"- dead letters by service/code: {row['dead_letters_by']}")
        lines.extend(f"- **errors not allowed**: {p}" for p in row["errors_over_budget"])  # type: ignore[union-attr,attr-defined]
        lines.extend(f"- **effect not exactly once**: {p[:300]}" for p in row["effect_problems"])  # type: ignore[union-attr,attr-defined]
        for kind, examples in row["problems"].items():  # type: ignore[union-attr,attr-defined]
            lines.append(f"- {kind} (first {len(examples)}):")
            lines.extend(f"  - `{e[:300]}`" for e in examples[:8])
        lines.append("")
    path_prefix.with_suffix(".md").write_text("\n".join(lines))
    plot(rows, path_prefix.with_suffix(".png"), f"{command} ({size} sizes)")


def plot(rows: list[dict[str, object]], path: Path, title: str) -> None:
    """Per scenario: requests answered, ended in an error, lost and doubled (stacked), and its seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [str(r["scenario"]) for r in rows]
    fig, (counts, seconds) = plt.subplots(1, 2, figsize=(13, 0.45 * len(rows) + 2), sharey=True)
    left = [0.0] * len(rows)
    for column, colour in (
        ("answered", "tab:green"),
        ("errored", "tab:orange"),
        ("lost", "tab:red"),
        ("doubled", "black"),
    ):
        values = [float(r[column]) for r in rows]  # type: ignore[arg-type]
        counts.barh(names, values, left=left, color=colour, label=column)
        left = [a + b for a, b in zip(left, values, strict=True)]
    counts.set_xlabel("requests")
    counts.legend(fontsize=8, loc="lower right")
    colours = ["tab:green" if r["passed"] else "tab:red" for r in rows]
    seconds.barh(names, [float(r["seconds"]) for r in rows], color=colours)  # type: ignore[arg-type]
    seconds.set_xlabel("seconds (green: passed)")
    counts.invert_yaxis()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
