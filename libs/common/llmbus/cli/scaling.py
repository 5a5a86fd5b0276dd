"""`llmbus status`'s scaling part: each pool's latest ScaleDecision and every worker's lifetime."""

from __future__ import annotations

import asyncio
import time

from rich.console import Console
from rich.table import Table

from llmbus.bus.tables import read_table
from llmbus.contract import topics as t
from llmbus.contract.messages import ScaleDecision, WorkerState, WorkerStatus
from llmbus.settings import BusSettings


def _ago(ms: int, now_ms: int) -> str:
    return f"{max(0, now_ms - ms) / 1000:.0f}s ago"


def lifetime_s(status: WorkerStatus, now_ms: int) -> float:
    """Process start → now, or → its last heartbeat when it has stopped."""
    end = status.sent_at_ms if status.state == WorkerState.STOPPED else now_ms
    return max(0.0, (end - status.started_at_ms) / 1000)


def print_scaling(console: Console, settings: BusSettings, fleet: dict[str, WorkerStatus]) -> None:
    now_ms = int(time.time() * 1000)
    decisions = asyncio.run(
        read_table(settings, t.Topics(settings.topic_prefix).name(t.SCALING), ScaleDecision, timeout_s=5)
    )
    if decisions:
        table = Table("pool", "policy", "replicas", "when", "reason", "actuator", title="latest scaling decisions")
        for d in sorted(decisions.values(), key=lambda d: d.pool):
            table.add_row(
                d.pool,
                d.policy,
                f"{d.current_replicas} → {d.desired_replicas}",
                _ago(d.decided_at_ms, now_ms),
                d.reason,
                d.actuator or "-",
            )
        console.print(table)
    lives = Table("worker", "state", "started", "lifetime", "cold start", title="worker lifetimes")
    for s in sorted(fleet.values(), key=lambda s: s.started_at_ms):
        lives.add_row(
            s.worker_id,
            s.state,
            _ago(s.started_at_ms, now_ms),
            f"{lifetime_s(s, now_ms):.0f}s",
            f"{s.cold_start_s}s" if s.cold_start_s is not None else "-",
        )
    console.print(lives)
