"""Which totals a CostRecord adds to: per tenant, model, pool, experiment/variant, kind, model version and
release (upgrade id / version); hour, day, month.

Pure: returns (hash key, field, increment) triples; the store applies them atomically with the
record's dedupe marker. Keys: `{<prefix>cost}:agg:<period>:<dimension>` (llmbus.state.keys), fields
`<value>|<metric>`.
Shadow and platform costs never reach the tenant dimension (they are the experiment's and the
platform's); everything reaches `total`.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from llmbus.contract.messages import BookedTo, CostRecord, ScaleDecision
from llmbus.state.keys import cost_key_root

PERIODS = {"hour": ("h", "%Y%m%d%H"), "day": ("d", "%Y%m%d"), "month": ("m", "%Y%m")}
TTL_S = {"hour": 14 * 86400, "day": 400 * 86400, "month": 3 * 400 * 86400}
DIMENSIONS = ("tenant", "model", "pool", "experiment", "kind", "version", "upgrade", "total")
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
    """`namespace`: the topic prefix."""
    return f"{cost_key_root(namespace)}agg:{period_id(period, at_ms)}:{dimension}"


def dimension_values(record: CostRecord) -> dict[str, str]:
    values = {"model": record.model or "-", "kind": record.kind.value, "total": "all"}
    if record.booked_to == BookedTo.TENANT:
        values["tenant"] = record.tenant
    if record.pool:
        values["pool"] = record.pool
    if record.experiment_id:
        values["experiment"] = f"{record.experiment_id}/{record.variant or '-'}"
    if (release := record.release) is not None:
        values["version"] = f"{record.model or '-'}@{release.model_version}"
        values["upgrade"] = f"{release.upgrade_id}/{release.model_version}"
    return values


def counts_request(record: CostRecord) -> bool:
    """The record counts a request: not the platform's time, nor a continued answer's earlier leg (its cost only)."""
    return record.booked_to != BookedTo.PLATFORM and record.leg is None


def increments(record: CostRecord, namespace: str) -> list[tuple[str, str, int]]:
    is_request = counts_request(record)
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


def _metrics(record: CostRecord) -> tuple[int, ...]:
    """The record's increments in METRICS order (0 where it adds nothing)."""
    return (
        record.cost_micro_usd,
        record.saving_micro_usd,
        record.output_cap_saving_micro_usd,
        record.cold_start_micro_usd,
        record.prompt_tokens,
        record.completion_tokens,
        record.cached_prompt_tokens,
        record.trimmed_prompt_tokens,
        int(counts_request(record)),
        record.baseline_micro_usd or 0,
        record.list_price_micro_usd or 0,
    )


def batch_increments(records: list[CostRecord], namespace: str) -> dict[str, dict[str, int]]:
    """The sum of `increments` over `records`, as {hash key: {field: increment}} (zeros left out).

    A batch adds to few keys (3 periods x 6 dimensions per hour) and few fields, so summing here
    first turns ~150 increments per record into a few thousand per batch, whatever its size.
    Records are grouped by hour and everything their dimensions depend on first (one dictionary
    step per record; the sums are column sums in C), then each group is spread over its
    dimensions, and each hour over its day and month.
    """
    groups: dict[tuple[int, tuple[object, ...]], list[tuple[int, ...]]] = defaultdict(list)
    first: dict[tuple[int, tuple[object, ...]], CostRecord] = {}
    for record in records:
        at = record.booked_at_ms
        depends_on = (record.booked_to, record.tenant, record.model, record.kind, record.pool, record.experiment_id)
        release = (record.release.upgrade_id, record.release.model_version) if record.release is not None else None
        group = (at - at % 3_600_000, (*depends_on, record.variant, release))
        vectors = groups[group]
        if not vectors:
            first[group] = record
        vectors.append(_metrics(record))
    by_hour: dict[tuple[int, str, str], list[int]] = {}
    for (hour_ms, labels), vectors in groups.items():
        vector = [sum(column) for column in zip(*vectors, strict=True)]
        for dim, value in dimension_values(first[(hour_ms, labels)]).items():
            sums = by_hour.get((hour_ms, dim, value))
            if sums is None:
                by_hour[(hour_ms, dim, value)] = vector
            else:
                by_hour[(hour_ms, dim, value)] = [a + b for a, b in zip(sums, vector, strict=True)]
    keys: dict[tuple[int, str, str], str] = {}  # (hour, period, dimension) -> hash key
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for (hour_ms, dim, value), sums in by_hour.items():
        for period in PERIODS:
            key = keys.get((hour_ms, period, dim))
            if key is None:
                key = keys[(hour_ms, period, dim)] = agg_key(namespace, period, hour_ms, dim)
            fields = out[key]
            for metric, n in zip(METRICS, sums, strict=True):
                if n:
                    fields[f"{value}|{metric}"] += n
    return {key: dict(fields) for key, fields in out.items() if fields}


def read_totals(flat: dict[str, int]) -> dict[str, dict[str, int]]:
    """`{"acme|cost": 5, ...}` -> `{"acme": {"cost": 5}}`."""
    out: dict[str, dict[str, int]] = {}
    for field, n in flat.items():
        value, _, metric = field.rpartition("|")
        out.setdefault(value, {})[metric] = n
    return out
