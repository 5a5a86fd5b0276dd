"""Turning records into messages; anything that does not decode becomes a BadMessage."""

from __future__ import annotations

import json
from typing import TypeVar

from aiokafka.structs import ConsumerRecord
from pydantic import ValidationError

from llmbus.messages import ErrorCode, Message

M = TypeVar("M", bound=Message)


class BadMessage(Exception):
    """A record that cannot be handled: goes to llm.dlq with `code` and `reason`."""

    def __init__(self, code: ErrorCode, reason: str, request_id: str | None = None, tenant: str | None = None):
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.request_id = request_id
        self.tenant = tenant


def _validation_reason(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "(message)"
        parts.append(f"{where}: {err['msg']}")
    more = f" (+{exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return "; ".join(parts) + more


def decode(record: ConsumerRecord, model: type[M]) -> M:
    raw = record.value
    if raw is None:
        raise BadMessage(ErrorCode.MALFORMED, "empty value (tombstone) where a message was expected")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadMessage(ErrorCode.MALFORMED, f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadMessage(ErrorCode.MALFORMED, f"expected a JSON object, got {type(data).__name__}")
    request_id = data.get("request_id") if isinstance(data.get("request_id"), str) else None
    tenant = data.get("tenant") if isinstance(data.get("tenant"), str) else None
    version = data.get("schema_version", 1)
    if isinstance(version, int) and version > model.SCHEMA_VERSION:
        raise BadMessage(
            ErrorCode.INVALID_REQUEST,
            f"{model.__name__} schema_version {version} is newer than this service reads ({model.SCHEMA_VERSION})",
            request_id,
            tenant,
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadMessage(ErrorCode.INVALID_REQUEST, _validation_reason(exc), request_id, tenant) from exc
