"""The reliability report: scenarios x sent / answered / lost / doubled, as JSON and Markdown."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from llmbus_tools.harness.reliability.service_rows import SIGNALS
from llmbus_tools.harness.reliability.stack import Outcome

COLUMNS = ("sent", "answered", "lost", "doubled", "bad_chunks", "misplaced", "unaccounted")
SERVICE_COLUMNS = ("exits", *SIGNALS)


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
        "# Reliability: delivery under injected faults",
        "",
        f"Command: `{command}` ({size} sizes), finished {meta['finished_at']}.",
        "",
        "Each scenario runs router → scheduler → 2 sim workers on the real broker and Redis, injects one",
        "fault mid-load, waits for the answers and then audits every topic of its namespace",
        "(`llmbus.audit`): exactly one final result per request id, the answering attempt's chunks",
        "gap-free and equal to the result's text, nothing on a topic it does not belong on. Error results",
        "beyond the bound the scenario fixed before the run fail it, and so does a downstream effect that",
        "was not exactly once (cost-accounting: every result billed once, Redis totals equal to llm.costs).",
        "See docs/reliability.md.",
        "",
        "| scenario | " + " | ".join(COLUMNS) + " | ok / error results | seconds | verdict |",
        "|---|" + "---:|" * len(COLUMNS) + "---|---:|---|",
    ]
    for row in rows:
        errors = ", ".join(f"{k} {v}" for k, v in sorted(row["error_results"].items())) or "none"  # type: ignore[union-attr]
        cells = " | ".join(str(row[c]) for c in COLUMNS)
        verdict = "pass" if row["passed"] else ("**did not finish**" if row["error"] else "**FAIL**")
        lines.append(f"| {row['scenario']} | {cells} | {row['ok_results']} / {errors} | {row['seconds']} | {verdict} |")
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
        lines.extend(f"- {note}" for note in row["notes"])  # type: ignore[union-attr]
        lines.extend(f"- **over the error bound**: {p}" for p in row["errors_over_bound"])  # type: ignore[union-attr]
        lines.extend(f"- **effect not exactly once**: {p[:300]}" for p in row["effect_problems"])  # type: ignore[union-attr]
        for kind, examples in row["problems"].items():  # type: ignore[union-attr]
            lines.append(f"- {kind} (first {len(examples)}):")
            lines.extend(f"  - `{e[:300]}`" for e in examples[:8])
        lines.append("")
    path_prefix.with_suffix(".md").write_text("\n".join(lines))
