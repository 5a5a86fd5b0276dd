"""Cost reports and the capacity planner, offline: `llmbus costs`, `llmbus plan` and `llmbus pricebook`.

    python -m llmbus_tools.costs report [--view tenant] [--json FILE] [--pricebook FILE]
    python -m llmbus_tools.costs plan [--config FILE] [--out bench/reports] ...
    python -m llmbus_tools.costs pricebook FILE

The `llmbus` CLI runs these as they are (it imports no service); they read the cost-accounting
service's price book model, aggregates and planner, which is why they live beside the services.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from llmbus.bus import Bus
from llmbus.contract import topics as t
from llmbus.contract.config_file import read_yaml
from llmbus.contract.messages import PriceBookUpdate, now_ms
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_services.cost_accounting.core.planner import PlanInputs
from llmbus_services.cost_accounting.core.planner import plan as make_plan
from llmbus_services.cost_accounting.core.prices import PriceBook, load_pricebook
from llmbus_tools.cost_report import cost_report
from llmbus_tools.plan_report import write

console = Console()
app = typer.Typer(help="cost reports, the capacity planner, price books", no_args_is_help=True)


@app.command("report")
def costs(
    view: str = typer.Option(
        "tenant", help="tenant | model | experiment | pool | kind | version (model@version) | upgrade (release/version)"
    ),
    json_out: str | None = typer.Option(
        None, "--json", help="write the whole report as JSON to this file ('-': stdout)"
    ),
    pricebook: str | None = typer.Option(None, help="price book YAML (default: the service's)"),
) -> None:
    """Costs per tenant / model / experiment / version / release, today and this month, with savings (Redis)."""
    settings = BusSettings()

    async def _read() -> dict[str, Any]:
        client = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
        try:
            return await cost_report(client, settings.topic_prefix, load_pricebook(pricebook), now_ms())
        finally:
            await client.aclose()

    report = asyncio.run(_read())
    if json_out:
        text = json.dumps(report, indent=2, sort_keys=True)
        if json_out == "-":
            print(text)
            return
        with open(json_out, "w") as out:
            out.write(text)
        console.print(f"report written to {json_out}")
    for label, section in report.items():
        table = Table(
            "name",
            "cost $",
            "requests",
            "prompt tok",
            "completion tok",
            "cache saving $",
            "cold start $",
            *(["scale up/down", "workers +/-"] if view == "pool" else []),
            title=f"{label.replace('_', ' ')} by {view}",
        )
        for name, row in section[view].items():
            scaling = [f"{row['scale_ups']}/{row['scale_downs']}", f"+{row['workers_added']}/-{row['workers_removed']}"]
            table.add_row(
                name,
                f"{row['cost_usd']:.6f}",
                str(row["requests"]),
                str(row["prompt_tokens"]),
                str(row["completion_tokens"]),
                f"{row['cache_saving_usd']:.6f}",
                f"{row['cold_start_usd']:.6f}",
                *(scaling if view == "pool" else []),
            )
        console.print(table)
        s = section["savings"]
        console.print(
            f"[bold]savings {label.replace('_', ' ')}[/bold] vs every request on the default model, untrimmed, "
            f"uncached: baseline ${s['baseline_usd']:.4f}, billed ${s['actual_usd']:.4f}; routing "
            f"${s['routing_usd']:.4f}, caching ${s['caching_usd']:.4f}, trimming ${s['trimming_usd']:.4f}, "
            f"other ${s['other_usd']:.4f}; output caps at most ${s['output_caps_usd']:.4f}"
        )


@app.command()
def plan(
    config: str | None = typer.Option(None, help="YAML with any PlanInputs fields (the case study's by default)"),
    consultations_per_day: int | None = typer.Option(None),
    consultations_per_instance_hour: float | None = typer.Option(None),
    peak_factor: float | None = typer.Option(None),
    gpu_usd_per_hour: float | None = typer.Option(None),
    budget_usd_per_month: float | None = typer.Option(None),
    out: str = typer.Option("bench/reports", help="where the Markdown, JSON and PNG go"),
) -> None:
    """Capacity planner: the design source's case study from first principles, every step shown."""
    fields: dict[str, Any] = read_yaml(config) if config else {}
    flags = {
        "consultations_per_day": consultations_per_day,
        "consultations_per_instance_hour": consultations_per_instance_hour,
        "peak_factor": peak_factor,
        "gpu_usd_per_hour": gpu_usd_per_hour,
        "budget_usd_per_month": budget_usd_per_month,
    }
    fields |= {k: v for k, v in flags.items() if v is not None}
    p = make_plan(PlanInputs.model_validate(fields))
    steps = Table("step", "arithmetic", title="steps")
    for what, how in p.steps:
        steps.add_row(what, how)
    console.print(steps)
    table = Table("scenario", "GPU-h/month", "GPU $", "API $", "total $", "budget", title="per month")
    for s in p.scenarios:
        fits = "within" if s.total_usd <= p.inputs.budget_usd_per_month else "[red]OVER[/red]"
        table.add_row(
            s.name,
            f"{s.gpu_hours_per_month:,.0f}",
            f"{s.gpu_usd_per_month:,.0f}",
            f"{s.api_usd_per_month:,.0f}",
            f"{s.total_usd:,.0f}",
            fits,
        )
    console.print(table)
    checks = Table("source's claim", "from its inputs", "verdict", title="where the source does not add up")
    for row in p.checks:
        checks.add_row(*row)
    console.print(checks)
    command = "llmbus plan " + " ".join(a for a in sys.argv[2:] if not a.startswith("/"))
    for path in write(p, Path(out), command.strip()):
        console.print(f"wrote {path}")


@app.command()
def pricebook(path: str = typer.Argument(..., help="price book YAML (validated before it is published)")) -> None:
    """Publish a price book to llm.pricebook: cost-accounting uses it from now on, without a restart."""
    raw = read_yaml(path)
    PriceBook.model_validate(raw)  # fail here, not in the service

    async def _publish() -> None:
        settings = BusSettings()
        bus = await Bus.start(settings, t.CLIENT)
        try:
            update = PriceBookUpdate(book=raw, updated_by="llmbus-cli")
            await bus.publisher.publish(bus.topics.name(t.PRICEBOOK), update, key="pricebook")
        finally:
            await bus.stop()

    asyncio.run(_publish())
    console.print(f"price book {path} published")


if __name__ == "__main__":
    app()
