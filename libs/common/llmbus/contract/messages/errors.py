"""Error codes a client can see in a final result or a DLQ entry."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, Field

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
    MIGRATION_LIMIT = "migration_limit"  # the answer was cut more often than its migration_limit allows
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


# Overloads and refusals: a request that ends with one of these may be sent again later, and its final result
# says when (`retry_after_ms`). Where whoever ends it knows better (a tenant's token bucket, an upstream's
# Retry-After, the end of a budget period), its own hint stands; otherwise this one. The one table of what
# each reaches a client as: docs/delivery.md, "Backpressure".
BACKPRESSURE_RETRY_MS: dict[ErrorCode, int] = {
    ErrorCode.RATE_LIMITED: 1_000,  # a tenant's own limits (HTTP 429)
    ErrorCode.OVER_BUDGET: 3_600_000,
    ErrorCode.QUEUE_FULL: 1_000,  # the fleet's capacity (HTTP 503)
    ErrorCode.OVER_CAPACITY: 1_000,
    ErrorCode.MODEL_UNAVAILABLE: 5_000,  # a worker that starts is known within a heartbeat timeout
    ErrorCode.MAX_ATTEMPTS: 1_000,
    ErrorCode.ENGINE_FAILED: 1_000,
    ErrorCode.ENGINE_OOM: 1_000,
    ErrorCode.WORKER_LOST: 1_000,
    ErrorCode.HANDED_BACK: 1_000,
    ErrorCode.WORKER_ERROR: 1_000,
    ErrorCode.INTERNAL: 1_000,
}


class ErrorInfo(Part):
    code: ErrorCode
    message: str
    retryable: bool = False
    retry_after_ms: int | None = Field(
        default=None, description="When the request may be sent again (every final overload and refusal says it)."
    )
    param: str | None = Field(
        default=None, max_length=256, description="The request's parameter the error is about (OpenAI's `param`)."
    )

    @classmethod
    def of(
        cls, code: ErrorCode, message: str, retry_after_ms: int | None = None, param: str | None = None
    ) -> ErrorInfo:
        return cls(code=code, message=message, retryable=code in RETRYABLE, retry_after_ms=retry_after_ms, param=param)

    def with_retry_hint(self) -> ErrorInfo:
        """This error as a request's final one: an overload or refusal carries when to send it again."""
        default_ms = BACKPRESSURE_RETRY_MS.get(self.code)
        if self.retry_after_ms is not None or default_ms is None:
            return self
        return self.model_copy(update={"retry_after_ms": default_ms})


def _hinted(error: ErrorInfo) -> ErrorInfo:
    return error.with_retry_hint()


# A request's final error (InferenceResult.error, and so its final chunk's): every overload or refusal says
# when to send the request again, whoever ended it.
FinalErrorInfo = Annotated[ErrorInfo, AfterValidator(_hinted)]
