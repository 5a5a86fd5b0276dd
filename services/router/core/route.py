"""Checks on a decoded request that make it a bad message (DLQ + final error) rather than a refusal."""

from __future__ import annotations

from llmbus import topics as t
from llmbus.messages import ErrorCode, InferenceRequest


class Rejected(Exception):
    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def check_reply_topic(request: InferenceRequest, allowed_prefix: str) -> None:
    if not request.reply_topic.startswith(allowed_prefix):
        raise Rejected(ErrorCode.INVALID_REQUEST, f"reply_topic must start with {allowed_prefix!r}")
    # Internal topics share the prefix: chunks written there would corrupt them (a worker's own
    # dispatch topic, llm.results, llm.workers ...). Only the default reply topic of the catalog is a client's.
    internal = request.reply_topic in t.BY_NAME and request.reply_topic != t.TOKENS
    if internal or request.reply_topic.startswith(t.DISPATCH_PREFIX):
        raise Rejected(ErrorCode.INVALID_REQUEST, f"reply_topic {request.reply_topic!r} is an internal topic")
