"""`llmbus costs`, `llmbus plan`, `llmbus pricebook`: the offline cost tools, run as they are.

They need the cost-accounting service's price book model, aggregates and planner; the CLI imports
no service, so each runs `python -m llmbus_tools.costs <command>` with the arguments given
(`llmbus costs --help` lists them).
"""

from __future__ import annotations

import typer

from llmbus.cli.tools import run_tool

COSTS = "llmbus_tools.costs"


def costs(ctx: typer.Context) -> None:
    """Costs per tenant / model / experiment / version / release, today and this month, with savings (Redis)."""
    run_tool(COSTS, "report", *ctx.args)


def plan(ctx: typer.Context) -> None:
    """Capacity planner: the design source's case study from first principles, every step shown."""
    run_tool(COSTS, "plan", *ctx.args)


def pricebook(ctx: typer.Context) -> None:
    """Publish a price book to llm.pricebook: cost-accounting uses it from now on, without a restart."""
    run_tool(COSTS, "pricebook", *ctx.args)
