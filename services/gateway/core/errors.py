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


# llmbus code -> (HTTP status, OpenAI error type)
_STATUS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.INVALID_REQUEST: (400, "invalid_request_error"),
    ErrorCode.MALFORMED: (400, "invalid_request_error"),
    ErrorCode.PROMPT_TOO_LONG: (400, "invalid_request_error"),
    ErrorCode.MAX_TOKENS_TOO_LARGE: (400, "invalid_request_error"),
    ErrorCode.RATE_LIMITED: (429, "rate_limit_error"),
    ErrorCode.OVER_BUDGET: (429, "insufficient_quota"),
    ErrorCode.QUEUE_FULL: (429, "rate_limit_error"),
    ErrorCode.MODEL_UNAVAILABLE: (503, "server_error"),
    ErrorCode.OVER_CAPACITY: (503, "server_error"),
    ErrorCode.DEADLINE_EXCEEDED: (504, "timeout"),
    ErrorCode.CANCELLED: (499, "cancelled"),
    ErrorCode.INTERNAL: (500, "server_error"),
}
# What OpenAI clients know these as.
_CODE_NAMES = {ErrorCode.PROMPT_TOO_LONG: "context_length_exceeded", ErrorCode.RATE_LIMITED: "rate_limit_exceeded"}


def from_error_info(error: ErrorInfo) -> ApiError:
    """The HTTP answer to a request that llmbus ended with `error`; retryable failures are 503s."""
    status, kind = _STATUS.get(error.code, (503, "server_error"))
    retry_after_s = None
    if status in (429, 503):
        retry_after_s = max(1, math.ceil((error.retry_after_ms or 1000) / 1000))
    return ApiError(status, error.message, kind, _CODE_NAMES.get(error.code, str(error.code)), None, retry_after_s)


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", code, param)


def unauthorized(message: str = "Incorrect API key provided.") -> ApiError:
    return ApiError(401, message, "invalid_request_error", "invalid_api_key")


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist.", "invalid_request_error", "model_not_found", "model")


def too_large(limit_bytes: int) -> ApiError:
    return ApiError(413, f"Request body larger than {limit_bytes} bytes.", "invalid_request_error", "request_too_large")


def unavailable(message: str, retry_after_s: int = 1) -> ApiError:
    return ApiError(503, message, "server_error", "service_unavailable", None, retry_after_s)
