"""The tenant and reply-topic policy (llmbus.security.tenancy): dev mode and auth mode."""

from __future__ import annotations

import pytest

from llmbus.contract import topics as t
from llmbus.security import tenancy
from llmbus.security.tenancy import Refused, Source

GATEWAY = Source(None)
ACME = Source("acme")


INTERNAL = (t.RESULTS, t.REQUESTS, t.ROUTED, t.WORKERS, t.MODELS, t.CONTROL, t.DLQ, t.SHADOW_TOKENS)


@pytest.mark.parametrize("topic", [*INTERNAL, "llm.dispatch.w1", "llm.requests.acme"])
@pytest.mark.parametrize("auth", [False, True])
def test_internal_topics_are_refused_in_every_mode(topic: str, auth: bool) -> None:
    problem = tenancy.reply_topic_problem(topic, GATEWAY, auth=auth, exists=True)
    assert problem is not None and "internal topic" in problem


@pytest.mark.parametrize("topic", [t.TOKENS, "llm.tokens.acme", "llm.replies.gw-1", "llm.replies-team-a"])
def test_dev_mode_accepts_existing_client_topics(topic: str) -> None:
    assert tenancy.reply_topic_problem(topic, GATEWAY, auth=False, exists=True) is None


def test_dev_mode_refuses_outside_the_prefix_and_missing_topics() -> None:
    outside = tenancy.reply_topic_problem("other.topic", GATEWAY, auth=False, exists=True)
    assert outside is not None and "must start with 'llm.'" in outside
    missing = tenancy.reply_topic_problem("llm.tokens.nobody", GATEWAY, auth=False, exists=False)
    assert missing is not None and "does not exist" in missing


@pytest.mark.parametrize("topic", ["llm.replies.acme", "llm.replies.acme.laptop-1"])
def test_auth_mode_accepts_the_tenants_own_namespace(topic: str) -> None:
    assert tenancy.reply_topic_problem(topic, ACME, auth=True, exists=True) is None


@pytest.mark.parametrize("topic", ["llm.replies.globex", "llm.replies.acmex", "llm.replies.globex.acme", t.TOKENS])
def test_auth_mode_refuses_foreign_and_shared_reply_topics(topic: str) -> None:
    problem = tenancy.reply_topic_problem(topic, ACME, auth=True, exists=True)
    assert problem is not None and "outside the tenant's namespace" in problem


def test_auth_mode_gateway_may_name_any_replies_topic_but_not_llm_tokens() -> None:
    assert tenancy.reply_topic_problem("llm.replies.gw-1", GATEWAY, auth=True, exists=True) is None
    assert tenancy.reply_topic_problem(t.TOKENS, GATEWAY, auth=True, exists=True) is not None


def test_the_source_is_the_request_topic() -> None:
    assert tenancy.source_of(t.REQUESTS) == GATEWAY
    assert tenancy.source_of("llm.requests.acme") == ACME
    for bad in ("llm.requests.a.b", "llm.requests.gw-x", "llm.results"):
        with pytest.raises(Refused):
            tenancy.source_of(bad)


def test_a_body_claiming_another_tenant_is_refused() -> None:
    assert tenancy.check_tenant(ACME, "acme") == "acme"
    assert tenancy.check_tenant(GATEWAY, "globex") == "globex"  # the gateway vouches (API key)
    with pytest.raises(Refused, match="claims tenant 'globex'"):
        tenancy.check_tenant(ACME, "globex")


def test_default_reply_topic_per_mode() -> None:
    assert tenancy.default_reply_topic(False, "acme") == t.TOKENS
    assert tenancy.default_reply_topic(True, "acme") == "llm.replies.acme"
