"""`llmbus router ...`: operations on the router (scorer retraining)."""

from __future__ import annotations

import typer

router_app = typer.Typer(help="router operations", no_args_is_help=True)


@router_app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def retrain(ctx: typer.Context) -> None:
    """Retrain the learned complexity scorer; replaces the model only if better on held-out data.

    Options are those of `python -m llmbus_tools.router_training.retrain --help`."""
    from llmbus_tools.router_training.retrain import main as retrain_main

    raise typer.Exit(retrain_main(list(ctx.args)))
