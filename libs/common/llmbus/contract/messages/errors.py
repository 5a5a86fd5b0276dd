"""Error codes a client can see in a final result or a DLQ entry."""

from __future__ import annotations

from enum import StrEnum

from llmbus.contract.messages.base import Part


class ErrorCode(StrEnum):
    INVALID_REQUEST = "invalid_request"  # schema or semantic validation failed
    MALFORMED = "malformed"  # bytes that are not a message at all
    REQUEST_TOO_LARGE = "request_too_large"  # over the bus's size limit (BusSettings.max_request_bytes)
    PROMPT_TOO_LONG = "prompt_too_long"
    MAX_TOKENS_TOO_LARGE = "max_tokens_too_large"
    RATE_LIMITED = "rate_limited"
    OVER_BUDGET = "over_budget"
    MODEL_UNAVAILABLE = "model_unavailable"  # nothing serves the model
    OVER_CAPACITY = "over_capacity"  # a worker could not admit it (KV / length); retryable
    QUEUE_FULL = "queue_full"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    ENGINE_OOM = "engine_oom"  # retryable
    ENGINE_FAILED = "engine_failed"  # retryable
    WORKER_LOST = "worker_lost"  # retryable
    HANDED_BACK = "handed_back"  # worker draining; retryable
    WORKER_ERROR = "worker_error"  # the worker failed around the engine (e.g. Redis down); retryable
    CANCELLED = "cancelled"
    MAX_ATTEMPTS = "max_attempts"
    INTERNAL = "internal"
    FORBIDDEN = "forbidden"  # the authenticated tenant may not do this (claim another tenant, reply elsewhere)


RETRYABLE = frozenset(
    {
        ErrorCode.OVER_CAPACITY,
        ErrorCode.ENGINE_OOM,
        ErrorCode.ENGINE_FAILED,
        ErrorCode.WORKER_LOST,
        ErrorCode.HANDED_BACK,
        ErrorCode.WORKER_ERROR,
    }
)


class ErrorInfo(Part):
    code: ErrorCode
    message: str
    retryable: bool = False
    retry_after_ms: int | None = None

    @classmethod
    def of(cls, code: ErrorCode, message: str, retry_after_ms: int | None = None) -> ErrorInfo:
        return cls(code=code, message=message, retryable=code in RETRYABLE, retry_after_ms=retry_after_ms)
