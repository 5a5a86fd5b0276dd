"""Feedback is its tenant's (the topic's when auth is on) and counts only on that tenant's own requests."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from llmbus.bus.memory import MemoryBus
from llmbus.client import LlmbusClient
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    DeadLetter,
    ErrorCode,
    Feedback,
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    RoutedRequest,
)
from llmbus.security import tenancy
from llmbus.settings import BusSettings
from llmbus_services.router.core.config import load_policy
from llmbus_services.shadow_comparator.core.join import feedback_belongs
from llmbus_services.shadow_comparator.flows import ComparatorHandlers
from llmbus_tools.router_training.feedback import authenticated, join_samples


def test_the_feedback_source_is_the_topic() -> None:
    assert tenancy.feedback_source_of(t.FEEDBACK) == tenancy.Source(None)
    assert tenancy.feedback_source_of("llm.feedback.acme") == tenancy.Source("acme")
    for bad in ("llm.feedback.a.b", "llm.feedback.gw-x", "llm.feedbackx", "llm.requests.acme"):
        with pytest.raises(tenancy.Refused):
            tenancy.feedback_source_of(bad)


def test_the_feedback_pattern_covers_the_shared_topic_and_each_tenants_only() -> None:
    pattern = re.compile(tenancy.feedback_topic_pattern("p."))
    assert all(pattern.match(n) for n in ("p.llm.feedback", "p.llm.feedback.acme", "p.llm.feedback.globex"))
    assert not any(pattern.match(n) for n in ("p.llm.feedback.a.b", "llm.feedback.acme", "p.llm.feedbackx"))


def test_feedback_claiming_another_tenant_on_a_tenants_topic_is_refused() -> None:
    with pytest.raises(tenancy.Refused, match="feedback claims tenant 'globex' but was written to the feedback topic"):
        tenancy.check_tenant(tenancy.Source("acme"), "globex", what="feedback")
    assert tenancy.check_tenant(tenancy.Source("acme"), "acme", what="feedback") == "acme"
    assert tenancy.check_tenant(tenancy.Source(None), "globex", what="feedback") == "globex"  # shared: the body


def test_a_tenants_feedback_topic_is_never_a_reply_topic() -> None:
    problem = tenancy.reply_topic_problem("llm.feedback.acme", tenancy.Source(None), auth=False, exists=True)
    assert problem is not None and "internal topic" in problem


def test_feedback_belongs_only_to_the_results_tenant() -> None:
    assert feedback_belongs("globex", "globex")
    assert not feedback_belongs("globex", "acme")
    assert not feedback_belongs(None, "acme")  # a link without a tenant trusts nobody


def test_the_client_writes_its_tenants_own_feedback_topic_when_auth_is_on() -> None:
    secured = BusSettings(
        topic_prefix="p.",
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_username="tenant-acme",
        kafka_sasl_password="x",  # type: ignore[arg-type]
    )
    topic, fb = LlmbusClient(secured).feedback_addressed(Feedback(request_id="r", score=1.0))
    assert (topic, fb.tenant) == ("p.llm.feedback.acme", "acme")
    topic, fb = LlmbusClient(BusSettings(topic_prefix="p.")).feedback_addressed(Feedback(request_id="r", score=1.0))
    assert (topic, fb.tenant) == ("p.llm.feedback", "default")


def test_retraining_counts_the_owners_feedback_even_after_a_foreign_one() -> None:
    policy = load_policy()
    model = "qwen2.5-coder-1.5b-instruct"
    req = InferenceRequest(request_id="r", tenant="globex", prompt="p", category="qa")
    routed = {"r": RoutedRequest(request=req, model=model)}
    results = {"r": InferenceResult(request_id="r", tenant="globex", status=ResultStatus.OK, model=model)}
    owner = Feedback(request_id="r", tenant="globex", score=0.9)
    foreign = authenticated("llm.feedback.acme", Feedback(request_id="r", tenant="acme", score=0.0))
    assert foreign is not None and foreign.tenant == "acme"
    rows = join_samples(routed, results, [owner, foreign], policy)
    assert [(r["id"], r["score"], r["label"]) for r in rows] == [("r", 0.9, "low")]
    assert join_samples(routed, results, [foreign], policy) == []
    # A body on acme's topic claiming globex is dropped; on the shared topic (dev, gateway) the body says.
    assert authenticated("llm.feedback.acme", Feedback(request_id="r", tenant="globex", score=0.0)) is None
    shared = authenticated(t.FEEDBACK, Feedback(request_id="r", tenant="globex", score=0.1))
    assert shared is not None and shared.tenant == "globex"


@dataclass
class FakeComparator:
    counted: list[Feedback] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    async def on_feedback(self, feedback: Feedback) -> None:
        self.counted.append(feedback)

    async def on_feedback_refused(self, reason: str) -> None:
        self.refused.append(reason)


async def test_the_handler_takes_the_tenant_from_the_topic_and_dead_letters_a_false_claim() -> None:
    bus = MemoryBus(BusSettings(topic_prefix="p."))
    runtime = bus.runtime(contracts.COMPARATOR)
    comparator = FakeComparator()
    handlers = ComparatorHandlers(comparator, runtime.publisher, bus.topics, None)  # type: ignore[arg-type]
    runtime.subscribe("feedback", handlers.on_feedback, pattern=tenancy.feedback_topic_pattern("p."))
    await bus.send("p.llm.feedback.acme", Feedback(request_id="r1", tenant="acme", score=1), key="r1")
    await bus.send("p.llm.feedback.acme", Feedback(request_id="r2", score=1), key="r2")
    await bus.send("p.llm.feedback", Feedback(request_id="r3", tenant="globex", score=1), key="r3")
    assert [(f.request_id, f.tenant) for f in comparator.counted] == [("r1", "acme"), ("r3", "globex")]
    assert len(comparator.refused) == 1 and "claims tenant 'default'" in comparator.refused[0]
    assert runtime.publisher.topics_written == {"p.llm.dlq"}
    [letter] = bus.published("p.llm.dlq", DeadLetter)
    assert letter.error_code == ErrorCode.FORBIDDEN and letter.request_id == "r2"
    assert letter.source_topic == "p.llm.feedback.acme" and "feedback topic of 'acme'" in letter.error
