"""Turning records into messages; anything that does not decode becomes a BadMessage.

Readers of internal topics ignore fields they do not know (llmbus.contract.tolerant); client
input (`STRICT_INPUT` models) refuses them.
"""

from __future__ import annotations

import json
import re
from typing import TypeVar

from aiokafka.structs import ConsumerRecord
from pydantic import ValidationError

from llmbus.contract.messages import ErrorCode, Message
from llmbus.contract.tolerant import without_unknown_fields

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


# Identifiers recovered from a message that failed validation are only used (to answer the
# client, in headers and keys) when they are plausible: never a megabyte "request id".
MAX_ID_CHARS = 128
_TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _plausible_id(value: object) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS and value.isprintable():
        return value
    return None


def _plausible_tenant(value: object) -> str | None:
    return value if isinstance(value, str) and _TENANT.match(value) else None


def decode(
    record: ConsumerRecord, model: type[M], *, max_bytes: int | None = None, required: tuple[str, ...] = ()
) -> M:
    """The record's message; BadMessage if it is not one (or, given `max_bytes`, is larger, or lacks
    one of the `required` fields the model would otherwise fill with a default, such as a fresh id).

    An oversize record is refused with REQUEST_TOO_LARGE before validation; its request id is
    still recovered when it parses, so the client gets a final error instead of silence.
    """
    raw = record.value
    if raw is None:
        raise BadMessage(ErrorCode.MALFORMED, "empty value (tombstone) where a message was expected")
    if max_bytes is None or len(raw) <= max_bytes:
        # The common case in one step: pydantic parses the JSON itself (a quarter of the cost of
        # json.loads + model_validate). Anything it refuses takes the slow path below, which says why.
        try:
            message = model.model_validate_json(raw)
        except ValidationError:
            pass
        else:
            if message.schema_version <= model.SCHEMA_VERSION and message.model_fields_set.issuperset(required):
                return message
    return _decode_slowly(raw, model, max_bytes, required)


def _decode_slowly(raw: bytes, model: type[M], max_bytes: int | None, required: tuple[str, ...]) -> M:
    """The record parsed step by step, so that a bad one gets its precise reason and its ids."""
    try:
        data = json.loads(raw)
    except RecursionError as exc:  # nested deeper than the parser's stack: input, not a service fault
        raise BadMessage(ErrorCode.MALFORMED, "JSON nested too deep") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        if max_bytes is not None and len(raw) > max_bytes:
            raise BadMessage(ErrorCode.REQUEST_TOO_LARGE, _too_large(len(raw), max_bytes)) from exc
        raise BadMessage(ErrorCode.MALFORMED, f"not JSON: {str(exc)[:200]}") from exc
    if not isinstance(data, dict):
        raise BadMessage(ErrorCode.MALFORMED, f"expected a JSON object, got {type(data).__name__}")
    request_id = _plausible_id(data.get("request_id"))
    tenant = _plausible_tenant(data.get("tenant"))
    if max_bytes is not None and len(raw) > max_bytes:
        raise BadMessage(ErrorCode.REQUEST_TOO_LARGE, _too_large(len(raw), max_bytes), request_id, tenant)
    if missing := [name for name in required if name not in data]:
        raise BadMessage(ErrorCode.INVALID_REQUEST, f"{', '.join(missing)}: required on the wire", request_id, tenant)
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
        if without_unknown_fields(data, model, exc) is None:  # strict client input, or no unknown field
            raise BadMessage(ErrorCode.INVALID_REQUEST, _validation_reason(exc), request_id, tenant) from exc
    try:  # a newer writer's additions dropped: what this reader knows must still be valid
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadMessage(ErrorCode.INVALID_REQUEST, _validation_reason(exc), request_id, tenant) from exc


def _too_large(size_bytes: int, max_bytes: int) -> str:
    return f"message of {size_bytes} bytes is over the limit of {max_bytes} bytes"
