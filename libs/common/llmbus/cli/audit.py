"""`llmbus audit`: read a namespace back and judge every request it was asked (llmbus.audit)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer
from rich.console import Console

from llmbus.audit import audit
from llmbus.audit.read import read_namespace, request_ids_in
from llmbus.contract.topics import Topics
from llmbus.settings import BusSettings

console = Console()


def audit_command(
    prefix: str = typer.Option(None, help="topic namespace (default: LLMBUS_TOPIC_PREFIX)"),
    ids: Path | None = typer.Option(
        None, help="file of request ids sent, one a line (default: every id on llm.requests)"
    ),
    account_requests: bool = typer.Option(
        True, help="every record on llm.requests must end as a result or a DLQ entry"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the counts and problems as JSON"),
) -> None:
    """Exactly one result per request, clean chunk streams, nothing misfiled: exit 1 when not."""
    settings = BusSettings() if prefix is None else BusSettings(topic_prefix=prefix)
    records = asyncio.run(read_namespace(settings))
    topics = Topics(settings.topic_prefix)
    sent = ids.read_text().split() if ids is not None else request_ids_in(topics, records)
    report = audit(topics, records, sent, account_requests=account_requests)
    if as_json:
        console.print_json(json.dumps({**report.counts(), "passed": report.passed, "problems": report.problems}))
    else:
        console.print(report.summary(), highlight=False)
    raise typer.Exit(0 if report.passed else 1)
