"""The `llmbus status` table: fits an 80-column terminal without cutting values short."""

from __future__ import annotations

from collections import defaultdict

from rich import box
from rich.table import Table

from llmbus.contract.messages import NodeHealth, NodeProfile, WorkerState, WorkerStatus

GIB = 1 << 30
# A worker not heard from for this long has gone (SIGKILLed, its node lost, a failed start long ago): llm.workers
# is compacted, so its last heartbeat stays on the topic; `llmbus status` leaves it out unless asked (--all).
GONE_AFTER_S = 600.0


def heard_recently(
    fleet: list[WorkerStatus], now_ms: int, gone_after_s: float = GONE_AFTER_S
) -> tuple[list[WorkerStatus], int]:
    """The workers whose last heartbeat is newer than `gone_after_s`, and how many are older."""
    cutoff_ms = now_ms - int(gone_after_s * 1000)
    recent = [s for s in fleet if s.sent_at_ms >= cutoff_ms]
    return recent, len(fleet) - len(recent)


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


def state_reasons(fleet: list[WorkerStatus]) -> list[str]:
    """`<worker>  <state>: <reason>` for each worker whose heartbeat says why it is in its state (a failed start):
    one line each under the table, where a long reason reads whole instead of folding in a narrow cell."""
    return [
        f"{s.worker_id}  {s.state}: {s.state_reason}"
        for s in sorted(fleet, key=lambda s: s.worker_id)
        if s.state_reason
    ]


def cold_start_table(fleet: list[WorkerStatus]) -> Table | None:
    """Each worker's cold start by phase (fetch and verify of its artifact, engine start, warm-up), seconds."""
    started = sorted((s for s in fleet if s.cold_start_phases_s), key=lambda s: s.worker_id)
    if not started:
        return None
    table = Table("worker", "cold start by phase, s", box=box.SIMPLE_HEAD, pad_edge=False, title="cold start")
    for s in started:
        table.add_row(s.worker_id, "  ".join(f"{phase} {secs:.2f}" for phase, secs in s.cold_start_phases_s.items()))
    return table


def metrics_table(urls: dict[str, str], answering: dict[str, bool]) -> Table:
    """Where each process of the local stack serves /metrics, and whether it answered just now."""
    table = Table("service", "metrics", "answers", box=box.SIMPLE_HEAD, pad_edge=False, title="/metrics")
    for name, url in sorted(urls.items()):
        table.add_row(name, url, "yes" if answering.get(name) else "[red]no[/red]")
    return table


def nodes_table(nodes: list[NodeProfile], fleet: list[WorkerStatus]) -> Table:
    """`llmbus status --nodes`: the fleet by hardware class, one row per node, then each class's total."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, title="nodes by hardware class")
    for header in ("class", "node", "hardware", "memory GiB", "TFLOP/s", "driver", "ECC c/u", "°C", "W", "health"):
        table.add_column(header, overflow="fold")
    table.add_column("workers", overflow="fold")
    on_node: dict[str, list[WorkerStatus]] = defaultdict(list)
    for status in fleet:
        if status.state != WorkerState.STOPPED:
            on_node[status.node_id].append(status)
    by_class: dict[str, list[NodeProfile]] = defaultdict(list)
    for node in nodes:
        by_class[node.hardware_class or "unknown"].append(node)
    for cls in sorted(by_class):
        members = sorted(by_class[cls], key=lambda n: n.node_id)
        for node in members:
            table.add_row(cls, *_node_cells(node, on_node.get(node.node_id, [])))
        if len(members) > 1:
            peak = sum(n.peak_tflops or 0.0 for n in members)
            workers = sum(len(on_node.get(n.node_id, [])) for n in members)
            table.add_row(f"[b]{cls}[/b]", f"{len(members)} nodes", "", "", f"{peak:,.0f}", *[""] * 5, str(workers))
    return table


def _node_cells(node: NodeProfile, workers: list[WorkerStatus]) -> list[str]:
    if node.gpus:
        names = sorted({g.name for g in node.gpus})
        hardware = f"{len(node.gpus)} x {', '.join(names)}"
        total, free = sum(g.memory_total_bytes for g in node.gpus), sum(g.memory_free_bytes for g in node.gpus)
        corrected = sum(g.ecc_corrected_volatile or 0 for g in node.gpus)
        uncorrected = sum(g.ecc_uncorrected_volatile or 0 for g in node.gpus)
        temps = [g.temperature_c for g in node.gpus if g.temperature_c is not None]
        powers = [g.power_w for g in node.gpus if g.power_w is not None]
        ecc, temp = f"{corrected}/{uncorrected}", str(max(temps)) if temps else "-"
        power = f"{sum(powers):.0f}" if powers else "-"
    else:
        hardware = f"{node.cpu_count} x {node.cpu_model or 'CPU'}"
        total, free, ecc, temp, power = node.memory_total_bytes, node.memory_free_bytes, "-", "-", "-"
    health = (
        node.health.value if node.health == NodeHealth.OK else f"[red]{node.health.value}[/red]: {node.health_reason}"
    )
    served = ", ".join(sorted(f"{w.worker_id} ({','.join(w.models)}, {w.state})" for w in workers)) or "-"
    return [
        f"{node.node_id}{'' if node.source == 'agent' else ' (worker probe)'}",
        hardware,
        f"{free / GIB:.0f} free of {total / GIB:.0f}",
        "-" if node.peak_tflops is None else f"{node.peak_tflops:,.1f}",
        node.driver_version or "-",
        ecc,
        temp,
        power,
        health,
        served,
    ]
