"""One archive row per archived record (pure): the columns every kind shares, and how a record fills them.

Every kind has the same columns, so one reader reads them all: the record's identity (`record_id`,
the dedupe key: a result's and cost's CloudEvents `ce_id`, a comparison's `comparison_id`, a
request's tenant/request id, a feedback's tenant/request id/digest of its body), where it came
from (topic, partition, offset), its event time, the facts a join needs as columns, and the whole
message as JSON in `payload` (what a reader decodes for anything else).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from llmbus.archive.layout import NO_TENANT, day_of
from llmbus.contract.cloudevents import KINDS
from llmbus.contract.messages import Comparison, CostRecord, Feedback, InferenceRequest, InferenceResult, Message

SCHEMA = pa.schema(
    [
        ("record_id", pa.string()),
        ("kind", pa.string()),
        ("tenant", pa.string()),
        ("day", pa.string()),
        ("request_id", pa.string()),
        ("event_time_ms", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("model", pa.string()),
        ("model_version", pa.string()),
        ("experiment_id", pa.string()),
        ("variant", pa.string()),
        ("status", pa.string()),
        ("score", pa.float64()),
        ("cost_micro_usd", pa.int64()),
        ("payload", pa.string()),
    ]
)
COLUMNS = tuple(SCHEMA.names)


@dataclass(frozen=True)
class Kind:
    """One archived kind of record: its topic's message model and how a message fills the shared columns."""

    name: str
    model: type[Message]
    record_id: Callable[[Any], str]
    event_time_ms: Callable[[Any, int], int]  # (message, the Kafka record's timestamp) → epoch ms
    tenant: Callable[[Any], str]
    extra: Callable[[Any], dict[str, Any]]


def _feedback_id(feedback: Feedback) -> str:
    # Feedback has no id of its own: the same body sent twice is one record, two scores are two.
    body = json.dumps(feedback.model_dump(mode="json", exclude={"tenant"}), sort_keys=True)
    return f"{feedback.tenant}/{feedback.request_id}/{hashlib.sha256(body.encode()).hexdigest()[:16]}"


def _result_facts(r: InferenceResult) -> dict[str, Any]:
    return {
        "model": r.model,
        "model_version": r.model_version,
        "experiment_id": r.experiment_id,
        "variant": r.variant,
        "status": r.status.value,
    }


def _cost_facts(c: CostRecord) -> dict[str, Any]:
    return {
        "model": c.model,
        "experiment_id": c.experiment_id,
        "variant": c.variant,
        "status": c.kind.value,
        "cost_micro_usd": c.cost_micro_usd,
    }


KINDS_BY_NAME: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind(
            "results",
            InferenceResult,
            KINDS[InferenceResult].event_id,
            lambda r, _ts: r.completed_at_ms,
            lambda r: r.tenant,
            _result_facts,
        ),
        Kind(
            "costs",
            CostRecord,
            KINDS[CostRecord].event_id,
            lambda c, _ts: c.booked_at_ms,
            lambda c: c.tenant,
            _cost_facts,
        ),
        Kind(
            "comparisons",
            Comparison,
            KINDS[Comparison].event_id,
            lambda c, _ts: c.compared_at_ms,
            lambda _c: NO_TENANT,
            lambda c: {"experiment_id": c.experiment_id, "model": c.candidate.model},
        ),
        Kind(
            "feedback",
            Feedback,
            _feedback_id,
            lambda _f, ts: ts,  # no time in the body: the record's (a resend on another day is another row)
            lambda f: f.tenant,
            lambda f: {"score": f.score},
        ),
        Kind(
            "requests",
            InferenceRequest,
            lambda r: f"{r.tenant}/{r.request_id}",
            lambda r, _ts: r.created_at_ms,
            lambda r: r.tenant,
            lambda r: {"model": r.model},
        ),
    )
}


@dataclass(frozen=True)
class Source:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int


def row_of(kind: Kind, message: Message, source: Source) -> dict[str, Any]:
    """The archive row of `message` (its tenant already checked against its topic's by the caller)."""
    event_ms = kind.event_time_ms(message, source.timestamp_ms)
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(kind.extra(message))
    row.update(
        record_id=kind.record_id(message),
        kind=kind.name,
        tenant=kind.tenant(message),
        day=day_of(event_ms),
        request_id=getattr(message, "request_id", None),
        event_time_ms=event_ms,
        topic=source.topic,
        partition=source.partition,
        offset=source.offset,
        payload=message.model_dump_json(exclude_none=True),
    )
    return row


def table_of(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)
