"""OpenAI error shapes and status codes, from llmbus error codes and the gateway's own checks."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmbus.contract.messages import ErrorCode, ErrorInfo


@dataclass
class ApiError(Exception):  # not frozen: raising sets __traceback__
    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    retry_after_s: int | None = None

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else {}


# llmbus code -> (HTTP status, OpenAI error type). The backpressure contract (docs/delivery.md, "Backpressure"):
# a tenant's own limits are 429, the fleet's capacity 503, both with Retry-After; every other code a request
# may end with after retries (a worker lost, an engine failed) is a 503 as well.
_STATUS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.INVALID_REQUEST: (400, "invalid_request_error"),
    ErrorCode.MALFORMED: (400, "invalid_request_error"),
    ErrorCode.PROMPT_TOO_LONG: (400, "invalid_request_error"),
    ErrorCode.MAX_TOKENS_TOO_LARGE: (400, "invalid_request_error"),
    ErrorCode.RATE_LIMITED: (429, "rate_limit_error"),
    ErrorCode.OVER_BUDGET: (429, "insufficient_quota"),
    ErrorCode.QUEUE_FULL: (503, "server_error"),
    ErrorCode.MODEL_UNAVAILABLE: (503, "server_error"),
    ErrorCode.OVER_CAPACITY: (503, "server_error"),
    ErrorCode.DEADLINE_EXCEEDED: (504, "timeout"),
    ErrorCode.CANCELLED: (499, "cancelled"),
    ErrorCode.FORBIDDEN: (403, "permission_error"),
    ErrorCode.INTERNAL: (500, "server_error"),
}
# What OpenAI clients know these as.
_CODE_NAMES = {ErrorCode.PROMPT_TOO_LONG: "context_length_exceeded", ErrorCode.RATE_LIMITED: "rate_limit_exceeded"}


def from_error_info(error: ErrorInfo) -> ApiError:
    """The HTTP answer to a request that llmbus ended with `error`, with Retry-After where it is an overload
    or refusal (its own hint, else the contract's default)."""
    status, kind = _STATUS.get(error.code, (503, "server_error"))
    hinted = error.with_retry_hint().retry_after_ms
    if hinted is None and status in (429, 503):
        hinted = 1000
    retry_after_s = None if hinted is None else max(1, math.ceil(hinted / 1000))
    code = _CODE_NAMES.get(error.code, str(error.code))
    return ApiError(status, error.message, kind, code, error.param, retry_after_s)


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", code, param)


def unauthorized(message: str = "Incorrect API key provided.") -> ApiError:
    return ApiError(401, message, "invalid_request_error", "invalid_api_key")


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist.", "invalid_request_error", "model_not_found", "model")


def too_large(limit_bytes: int, what: str = "Request body") -> ApiError:
    return ApiError(413, f"{what} larger than {limit_bytes} bytes.", "invalid_request_error", "request_too_large")


def concurrency_limited(limit: int) -> ApiError:
    """The tenant already has `limit` requests in flight on this instance (its share of the slots)."""
    message = f"Too many requests in flight for this API key's tenant (at most {limit} at once); retry shortly."
    return ApiError(429, message, "rate_limit_error", "rate_limit_exceeded", None, 1)


def unavailable(message: str, retry_after_s: int = 1) -> ApiError:
    return ApiError(503, message, "server_error", "service_unavailable", None, retry_after_s)
