"""CloudEvents 1.0 attributes, in Kafka binary mode, on the records analytics reads.

A CloudEvents consumer (OpenMeter, Knative, an OpenTelemetry pipeline, the `cloudevents` SDK's
Kafka binding) reads llmbus's analytics topics as events without knowing llmbus: the attributes
travel as `ce_*` headers beside llmbus's own, the payload stays the message's JSON. Pure: the
headers come from the message alone, so a record sent again carries the same ones.

`ce_id` is the record's idempotency id (a consumer dedupes on it), `ce_subject` the tenant where
the record has one (else what the record is about: experiment, pool), `ce_time` the time the
record states (not the time of sending), `ce_type` `io.llmbus.<kind>.v<schema version>`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llmbus.contract.messages import (
    BudgetStatus,
    Comparison,
    CostRecord,
    ExperimentDecision,
    InferenceResult,
    Message,
    ScaleDecision,
)

SPECVERSION = b"1.0"
CONTENT_TYPE = "content-type"
JSON = b"application/json"
TYPE_PREFIX = "io.llmbus."
PREFIX = "ce_"


@dataclass(frozen=True)
class EventKind:
    name: str  # ce_type is io.llmbus.<name>.v<version>
    event_id: Callable[[Any], str]
    subject: Callable[[Any], str]
    time_ms: Callable[[Any], int]


KINDS: dict[type[Message], EventKind] = {
    # Request identity is (tenant, request id): a result's id is both.
    InferenceResult: EventKind(
        "result", lambda r: f"{r.tenant}/{r.request_id}", lambda r: r.tenant, lambda r: r.completed_at_ms
    ),
    CostRecord: EventKind(
        "cost", lambda c: f"{c.tenant}/{c.record_id or c.request_id}", lambda c: c.tenant, lambda c: c.booked_at_ms
    ),
    Comparison: EventKind(
        "comparison", lambda c: c.comparison_id, lambda c: c.experiment_id, lambda c: c.compared_at_ms
    ),
    ExperimentDecision: EventKind(
        "decision",
        lambda d: f"{d.experiment_id}/{d.step_from}-{d.step_to}/{d.decided_at_ms}",
        lambda d: d.experiment_id,
        lambda d: d.decided_at_ms,
    ),
    ScaleDecision: EventKind(
        "scaling", lambda s: f"{s.pool}/{s.decided_at_ms}", lambda s: s.pool, lambda s: s.decided_at_ms
    ),
    BudgetStatus: EventKind(
        "budget",
        lambda b: f"{b.tenant}/{b.period_key or '-'}/{b.updated_at_ms}",
        lambda b: b.tenant,
        lambda b: b.updated_at_ms,
    ),
}


def rfc3339(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_type(model: type[Message]) -> str | None:
    kind = KINDS.get(model)
    return f"{TYPE_PREFIX}{kind.name}.v{model.SCHEMA_VERSION}" if kind else None


def cloudevent_headers(value: Message, service: str) -> list[tuple[str, bytes]]:
    """The CloudEvents headers of `value` published by `service`; none for a message analytics does not read."""
    kind = KINDS.get(type(value))
    if kind is None:
        return []
    return [
        ("ce_specversion", SPECVERSION),
        ("ce_id", kind.event_id(value).encode()),
        ("ce_source", f"/llmbus/{service}".encode()),
        ("ce_type", f"{TYPE_PREFIX}{kind.name}.v{value.SCHEMA_VERSION}".encode()),
        ("ce_time", rfc3339(kind.time_ms(value)).encode()),
        ("ce_subject", kind.subject(value).encode()),
        (CONTENT_TYPE, JSON),
    ]


def is_cloudevent_header(name: str) -> bool:
    return name.startswith(PREFIX) or name == CONTENT_TYPE
