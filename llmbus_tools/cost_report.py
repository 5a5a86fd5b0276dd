"""Reading the aggregates back for `llmbus costs` (today and this month, with savings)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import redis.asyncio as redis

from llmbus.state.text import text_of
from llmbus_services.cost_accounting.core.aggregates import SCALING_METRICS, agg_key, read_totals
from llmbus_services.cost_accounting.core.money import usd
from llmbus_services.cost_accounting.core.prices import PriceBook
from llmbus_services.cost_accounting.core.savings import savings

VIEWS = ("tenant", "model", "experiment", "pool", "kind", "version", "upgrade", "total")


def _row(m: dict[str, int]) -> dict[str, Any]:
    return {
        "cost_usd": usd(m.get("cost", 0)),
        "requests": m.get("requests", 0),
        "prompt_tokens": m.get("prompt", 0),
        "completion_tokens": m.get("completion", 0),
        "cache_saving_usd": usd(m.get("saving", 0)),
        "cold_start_usd": usd(m.get("cold", 0)),
    } | {metric: m.get(metric, 0) for metric in SCALING_METRICS}  # pools only: the autoscaler's moves


async def cost_report(client: redis.Redis, namespace: str, book: PriceBook, at_ms: int) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for period, label in (("day", "today"), ("month", "this_month")):
        section: dict[str, Any] = {}
        for view in VIEWS:
            raw = await client.hgetall(agg_key(namespace, period, at_ms, view))
            totals = read_totals({text_of(k): int(v) for k, v in raw.items()})
            section[view] = {name: _row(m) for name, m in sorted(totals.items())}
            if view == "tenant":
                all_tenants: Counter[str] = Counter()
                for m in totals.values():
                    all_tenants.update(m)
                section["savings_by_tenant"] = {name: savings(m, book).as_dict() for name, m in sorted(totals.items())}
                section["savings"] = savings(dict(all_tenants), book).as_dict()
        report[label] = section
    return report
