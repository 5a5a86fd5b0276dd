"""`llmbus dlq replay`: what a service dead-lettered, written to its source topics again (llmbus.bus.dlq_replay)."""

from __future__ import annotations

import asyncio

import typer
from rich.console import Console

from llmbus.bus.dlq_replay import dead_letters, replay
from llmbus.cli.export import since_epoch_ms
from llmbus.contract import topics as t
from llmbus.settings import BusSettings

app = typer.Typer(help="Dead letters: replay what a service could not handle", no_args_is_help=True)
console = Console()


@app.command("replay")
def replay_command(
    source: str = typer.Option(..., help=f"the service that dead-lettered them, e.g. {t.COST}"),
    since: str = typer.Option(..., help="dead-lettered since: 2h, 30m, 7d, a date or an ISO time"),
    topic: list[str] = typer.Option([], help="only records of this source topic (repeat), e.g. llm.results"),
    dry_run: bool = typer.Option(False, help="list what would be replayed, write nothing"),
    timeout_s: float = typer.Option(60.0, help="for reading llm.dlq and the source records"),
) -> None:
    """Write every record SOURCE dead-lettered since SINCE back to its source topic and partition.

    Safe to run twice: each consumer's once-only markers make a record it handled already a no-op
    (cost-accounting bills a result once however often it comes). On a secured broker, run it as a
    principal that may write the source topics (the broker's admin)."""
    if source not in t.ALL_SERVICES:
        raise typer.BadParameter(f"{source!r}: one of {', '.join(t.ALL_SERVICES)}")
    settings = BusSettings()

    async def run() -> None:
        letters = await dead_letters(settings, since_epoch_ms(since), source=source, topics=topic, timeout_s=timeout_s)
        for letter in letters:
            console.print(
                f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset} "
                f"{letter.error_code}: {letter.error[:120]}",
                highlight=False,
            )
        if dry_run:
            console.print(f"{len(letters)} dead letters of {source}; nothing written (--dry-run)")
            return
        report = await replay(settings, letters, timeout_s)
        console.print(report.summary())
        if report.gone:
            raise typer.Exit(1)

    asyncio.run(run())
