"""Which totals a CostRecord adds to: per tenant, model, pool, experiment/variant, kind; hour, day, month.

Pure: returns (hash key, field, increment) triples; the store applies them atomically with the
record's dedupe marker. Keys: `<ns>cost:agg:<period>:<dimension>`, fields `<value>|<metric>`.
Shadow and platform costs never reach the tenant dimension (they are the experiment's and the
platform's); everything reaches `total`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from llmbus.messages import BookedTo, CostRecord, ScaleDecision

PERIODS = {"hour": ("h", "%Y%m%d%H"), "day": ("d", "%Y%m%d"), "month": ("m", "%Y%m")}
TTL_S = {"hour": 14 * 86400, "day": 400 * 86400, "month": 3 * 400 * 86400}
DIMENSIONS = ("tenant", "model", "pool", "experiment", "kind", "total")
METRICS = (
    "cost",
    "saving",
    "capped",
    "cold",
    "prompt",
    "completion",
    "cached",
    "trimmed",
    "requests",
    "baseline",
    "list",
)


def period_id(period: str, at_ms: int) -> str:
    tag, fmt = PERIODS[period]
    return f"{tag}{datetime.fromtimestamp(at_ms / 1000, UTC).strftime(fmt)}"


def agg_key(namespace: str, period: str, at_ms: int, dimension: str) -> str:
    return f"{namespace}cost:agg:{period_id(period, at_ms)}:{dimension}"


def dimension_values(record: CostRecord) -> dict[str, str]:
    values = {"model": record.model or "-", "kind": record.kind.value, "total": "all"}
    if record.booked_to == BookedTo.TENANT:
        values["tenant"] = record.tenant
    if record.pool:
        values["pool"] = record.pool
    if record.experiment_id:
        values["experiment"] = f"{record.experiment_id}/{record.variant or '-'}"
    return values


def increments(record: CostRecord, namespace: str) -> list[tuple[str, str, int]]:
    is_request = record.booked_to != BookedTo.PLATFORM
    metrics = {
        "cost": record.cost_micro_usd,
        "saving": record.saving_micro_usd,
        "capped": record.output_cap_saving_micro_usd,
        "cold": record.cold_start_micro_usd,
        "prompt": record.prompt_tokens,
        "completion": record.completion_tokens,
        "cached": record.cached_prompt_tokens,
        "requests": 1 if is_request else 0,
        "trimmed": record.trimmed_prompt_tokens,
        "baseline": record.baseline_micro_usd or 0,
        "list": record.list_price_micro_usd or 0,
    }
    out: list[tuple[str, str, int]] = []
    for dim, value in dimension_values(record).items():
        for period in PERIODS:
            key = agg_key(namespace, period, record.booked_at_ms, dim)
            out.extend((key, f"{value}|{m}", n) for m, n in metrics.items() if n)
    return out


SCALING_METRICS = ("scale_ups", "scale_downs", "workers_added", "workers_removed")


def scaling_increments(decision: ScaleDecision, namespace: str) -> list[tuple[str, str, int]]:
    """A decision that changed a pool, counted on the pool's row beside the cold starts it paid
    (`cold`, and the `cold_start_waste` kind): how often the autoscaler moved and by how much."""
    delta = decision.desired_replicas - decision.current_replicas
    metrics = {
        "scale_ups": 1 if delta > 0 else 0,
        "scale_downs": 1 if delta < 0 else 0,
        "workers_added": max(delta, 0),
        "workers_removed": max(-delta, 0),
    }
    out: list[tuple[str, str, int]] = []
    for period in PERIODS:
        key = agg_key(namespace, period, decision.decided_at_ms, "pool")
        out.extend((key, f"{decision.pool}|{m}", n) for m, n in metrics.items() if n)
    return out


def read_totals(flat: dict[str, int]) -> dict[str, dict[str, int]]:
    """`{"acme|cost": 5, ...}` -> `{"acme": {"cost": 5}}`."""
    out: dict[str, dict[str, int]] = {}
    for field, n in flat.items():
        value, _, metric = field.rpartition("|")
        out.setdefault(value, {})[metric] = n
    return out
