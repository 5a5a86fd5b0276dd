"""The `llmbus status` table: fits an 80-column terminal without cutting values short."""

from __future__ import annotations

from rich import box
from rich.table import Table

from llmbus.contract.messages import WorkerStatus


def fleet_table(fleet: list[WorkerStatus]) -> Table:
    # Short headers and a light box leave the width to the values; long ones wrap, never end in "…".
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("worker", overflow="fold")
    table.add_column("state", overflow="fold")
    table.add_column("model", overflow="fold")
    for header in ("run", "wait", "KV", "prefix", "tok/s", "cold s"):
        table.add_column(header, justify="right", no_wrap=True)
    for s in sorted(fleet, key=lambda s: s.worker_id):
        table.add_row(
            s.worker_id,
            s.state,
            ",".join(s.models),
            str(s.num_requests_running),
            str(s.num_requests_waiting),
            f"{s.kv_cache_usage_perc:.0%}",
            f"{s.prefix_cache_hit_rate:.0%}",
            f"{s.generation_tokens_per_s:.0f}",
            "-" if s.cold_start_s is None else f"{s.cold_start_s:.1f}",
        )
    return table


def metrics_table(urls: dict[str, str], answering: dict[str, bool]) -> Table:
    """Where each process of the local stack serves /metrics, and whether it answered just now."""
    table = Table("service", "metrics", "answers", box=box.SIMPLE_HEAD, pad_edge=False, title="/metrics")
    for name, url in sorted(urls.items()):
        table.add_row(name, url, "yes" if answering.get(name) else "[red]no[/red]")
    return table
