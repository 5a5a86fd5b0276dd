"""Where a request goes (pure): the model it names, else the default."""

from __future__ import annotations

from llmbus.messages import ErrorCode, InferenceRequest, RoutedRequest, now_ms
from llmbus.tokens import estimate_tokens


class Rejected(Exception):
    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def check_reply_topic(request: InferenceRequest, allowed_prefix: str) -> None:
    if not request.reply_topic.startswith(allowed_prefix):
        raise Rejected(ErrorCode.INVALID_REQUEST, f"reply_topic must start with {allowed_prefix!r}")


def route(request: InferenceRequest, default_model: str, received_at_ms: int | None = None) -> RoutedRequest:
    model = request.model or default_model
    return RoutedRequest(
        request=request,
        model=model,
        route_reason="explicit" if request.model else "default",
        prompt_tokens_est=estimate_tokens(request.prompt_text()),
        received_at_ms=received_at_ms or now_ms(),
    )
