"""`llmbus plan` output: a Markdown report with every step, JSON, and a PNG (instances per hour; cost vs budget)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from llmbus_services.cost_accounting.core.planner import Plan


def markdown(p: Plan, command: str) -> str:
    i = p.inputs
    lines = [
        "# Capacity plan: the design source's case study, recomputed",
        "",
        f"Produced by `{command}` (pure arithmetic; no measurement involved).",
        "",
        "## Inputs",
        "",
        *(f"- {k}: {v}" for k, v in i.model_dump().items() if not k.startswith("claimed_")),
        "",
        "## Steps",
        "",
        "| step | arithmetic |",
        "|---|---|",
        *(f"| {what} | {how} |" for what, how in p.steps),
        "",
        "## Scenarios (per month)",
        "",
        f"| scenario | GPU-hours | GPU $ | API $ | total $ | vs budget ${i.budget_usd_per_month:,.0f} | notes |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for s in p.scenarios:
        fits = "within" if s.total_usd <= i.budget_usd_per_month else "OVER"
        lines.append(
            f"| {s.name} | {s.gpu_hours_per_month:,.0f} | {s.gpu_usd_per_month:,.0f} | {s.api_usd_per_month:,.0f} | "
            f"{s.total_usd:,.0f} | {fits} | {s.notes} |"
        )
    lines += ["", "## Where the source's arithmetic does not follow from its inputs", ""]
    lines += ["| source's claim | from its own inputs | verdict |", "|---|---|---|"]
    lines += [f"| {claim} | {computed} | {verdict} |" for claim, computed, verdict in p.checks]
    lines += ["", "![instances per hour and cost by scenario](plan_case_study.png)", ""]
    return "\n".join(lines)


def write(p: Plan, out_dir: Path, command: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js, png = (out_dir / f"plan_case_study.{ext}" for ext in ("md", "json", "png"))
    md.write_text(markdown(p, command))
    js.write_text(
        json.dumps(
            {
                "command": command,
                "inputs": p.inputs.model_dump(),
                "steps": p.steps,
                "scenarios": [asdict(s) | {"total_usd": s.total_usd} for s in p.scenarios],
                "checks": p.checks,
            },
            indent=2,
        )
    )
    _png(p, png)
    return [md, js, png]


def _png(p: Plan, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for s in p.scenarios:
        left.step(range(24), s.instances_by_hour, where="post", label=s.name)
    left.set(xlabel="hour of day (UTC)", ylabel="GPU instances", title="Instances per hour", xticks=range(0, 24, 2))
    left.legend(fontsize=7)
    names = [s.name for s in p.scenarios]
    right.barh(names, [s.gpu_usd_per_month for s in p.scenarios], label="GPU")
    right.barh(
        names, [s.api_usd_per_month for s in p.scenarios], left=[s.gpu_usd_per_month for s in p.scenarios], label="API"
    )
    right.axvline(p.inputs.budget_usd_per_month, color="red", linestyle="--", label="budget")
    right.axvline(p.inputs.claimed_monthly_usd, color="grey", linestyle=":", label="source's $9,375")
    right.set(xlabel="USD per month", title="Cost by scenario vs budget")
    right.tick_params(axis="y", labelsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
