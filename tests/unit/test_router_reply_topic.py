"""A reply topic can never be an internal topic, even in the unauthenticated dev mode."""

from __future__ import annotations

import pytest

from llmbus import topics as t
from llmbus.messages import InferenceRequest
from services.router.core.route import Rejected, check_reply_topic


@pytest.mark.parametrize(
    "topic", [t.RESULTS, t.REQUESTS, t.ROUTED, t.WORKERS, t.DLQ, t.SHADOW_TOKENS, "llm.dispatch.w1"]
)
def test_internal_topics_are_refused(topic: str) -> None:
    with pytest.raises(Rejected, match="internal topic"):
        check_reply_topic(InferenceRequest(prompt="p", reply_topic=topic), "llm.")


@pytest.mark.parametrize("topic", [t.TOKENS, "llm.tokens.acme", "llm.replies-team-a"])
def test_client_reply_topics_pass(topic: str) -> None:
    check_reply_topic(InferenceRequest(prompt="p", reply_topic=topic), "llm.")


def test_outside_the_prefix_is_refused() -> None:
    with pytest.raises(Rejected, match="must start with"):
        check_reply_topic(InferenceRequest(prompt="p", reply_topic="other.topic"), "llm.")
