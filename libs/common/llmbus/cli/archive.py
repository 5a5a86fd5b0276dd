"""`llmbus archive compact`: each closed day's small archive files merged into one (llmbus.archive.compact)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import typer
from rich.console import Console

from llmbus.archive.compact import CompactionBusy, compact
from llmbus.archive.layout import default_root

console = Console()
archive_app = typer.Typer(help="Maintain the archive (LLMBUS_ARCHIVE_DIR)", no_args_is_help=True)


@archive_app.command("compact")
def compact_archive(
    archive: Path = typer.Option(
        Path(os.environ.get("LLMBUS_ARCHIVE_DIR", str(default_root()))), help="the archive's directory"
    ),
    before: str | None = typer.Option(None, help="compact days before this one, YYYY-MM-DD (default: today, UTC)"),
    min_files: int = typer.Option(2, min=2, help="leave a directory with fewer files as it is"),
    compression: str = typer.Option("zstd", help="Parquet compression of the merged files"),
) -> None:
    """Merge each closed day/tenant directory's files into one, each record id once; safe to kill
    and to run beside the archive service (services/archive/README.md, Compaction)."""
    before_day = before or dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    try:
        done = compact(archive, before_day, min_files=min_files, compression=compression)
    except CompactionBusy as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    for item in done:
        console.print(f"{item.directory}: {item.files_in} files, {item.rows_in} rows → 1 file, {item.rows_out} rows")
    console.print(f"{len(done)} directories compacted (days before {before_day})")
