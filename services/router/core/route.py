"""Checks on a decoded request that make it a bad message (DLQ + final error) rather than a refusal."""

from __future__ import annotations

from llmbus.messages import ErrorCode, InferenceRequest


class Rejected(Exception):
    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def check_reply_topic(request: InferenceRequest, allowed_prefix: str) -> None:
    if not request.reply_topic.startswith(allowed_prefix):
        raise Rejected(ErrorCode.INVALID_REQUEST, f"reply_topic must start with {allowed_prefix!r}")
