"""`llmbus router ...`: operations on the router (scorer retraining)."""

from __future__ import annotations

import typer

from llmbus.cli.tools import TOOL_COMMAND, run_tool

router_app = typer.Typer(help="router operations", no_args_is_help=True)


@router_app.command(context_settings=TOOL_COMMAND)
def retrain(ctx: typer.Context) -> None:
    """Retrain the learned complexity scorer; replaces the model only if better on held-out data.

    Runs `python -m llmbus_tools.router_training.retrain` with these options (see its --help)."""
    run_tool("llmbus_tools.router_training.retrain", *ctx.args)
