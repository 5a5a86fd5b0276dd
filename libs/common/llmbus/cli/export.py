"""`llmbus export rlhf`: training records from the archive (services/archive), as JSONL or Parquet."""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path

import typer
from rich.console import Console

from llmbus.archive import read, rlhf
from llmbus.archive.layout import day_of, default_root

console = Console()
export_app = typer.Typer(help="Export from the archive (LLMBUS_ARCHIVE_DIR) for offline use", no_args_is_help=True)
_RELATIVE = re.compile(r"^(\d+)([dhm])$")
_UNIT_S = {"d": 86_400, "h": 3_600, "m": 60}


def since_epoch_ms(since: str, now: dt.datetime | None = None) -> int:
    """`7d`, `12h`, `30m` (before now), a date `2026-11-30` or an ISO time `2026-11-30T12:00:00Z` (UTC if no zone)."""
    now = now or dt.datetime.now(dt.UTC)
    if match := _RELATIVE.match(since):
        return int((now.timestamp() - int(match[1]) * _UNIT_S[match[2]]) * 1000)
    try:
        when = dt.datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"{since!r}: use 7d, 12h, 30m, a date or an ISO time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def write_records(records: list[rlhf.RlhfRecord], out: Path) -> None:
    """JSONL, or Parquet when `out` ends in .parquet (nested fields as Parquet lists and structs)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist([r.model_dump(mode="json") for r in records]), out)
        return
    with out.open("w") as handle:
        for record in records:
            handle.write(record.model_dump_json() + "\n")


@export_app.command("rlhf")
def export_rlhf(
    out: Path = typer.Option(..., "--out", help="file to write: .jsonl, or .parquet"),
    since: str = typer.Option("7d", help="answers completed since: 7d, 12h, a date or an ISO time"),
    tenant: str | None = typer.Option(None, help="one tenant (default: every tenant)"),
    archive: Path = typer.Option(
        Path(os.environ.get("LLMBUS_ARCHIVE_DIR", str(default_root()))), help="the archive's directory"
    ),
    unlabelled: bool = typer.Option(False, "--unlabelled", help="also answers nobody gave feedback on"),
) -> None:
    """Prompt + answer + model version + experiment/variant + feedback, one record per answered
    request (schema: schemas/exports/RlhfRecord.json)."""
    since_ms = since_epoch_ms(since)
    day = day_of(since_ms)
    # Feedback and prompts may come before or after the answer's day: read them from a day earlier on.
    before = day_of(since_ms - 86_400_000)
    records = rlhf.join(
        read.read_rows(archive, "results", day, tenant),
        read.read_rows(archive, "requests", before, tenant),
        read.read_rows(archive, "feedback", before, tenant),
        read.read_rows(archive, "costs", before, tenant),
        since_ms=since_ms,
        labelled_only=not unlabelled,
    )
    write_records(records, out)
    console.print(f"{len(records)} records written to {out}")
