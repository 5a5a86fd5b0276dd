"""Rule order, defaults and explicit models of the routing policy."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmbus.contract.messages import ChatMessage, InferenceRequest
from llmbus.tokens import estimate_tokens
from llmbus_services.router.core.complexity import build_scorer
from llmbus_services.router.core.config import RouterPolicy, load_policy
from llmbus_services.router.core.heuristic import features_of
from llmbus_services.router.core.pipeline import RouterCore
from llmbus_services.router.core.rules import RouteFeatures, decide_route

STRONG, MID, SMALL, DEFAULT = "gpt-4.1", "llama-3.3-70b-instruct", "qwen2.5-coder-1.5b-instruct", "gpt-4.1-mini"


@pytest.fixture(scope="module")
def policy() -> RouterPolicy:
    return load_policy()


def feats(**kw: object) -> RouteFeatures:
    base: dict[str, object] = {"complexity": 0.3, "prompt_tokens": 100}
    return RouteFeatures(**(base | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("features", "model", "reason"),
    [
        (feats(complexity=0.95), STRONG, "rule:complexity_high"),
        (feats(complexity=0.8), DEFAULT, "default"),  # strictly greater than 0.8
        (feats(token_budget=4999), MID, "rule:token_budget_low"),
        (feats(token_budget=5000), DEFAULT, "default"),
        (feats(category="quick_edit"), SMALL, "rule:editor_fast"),
        (feats(category="tab_completion"), SMALL, "rule:editor_fast"),
        (feats(category="chat"), DEFAULT, "default"),
        (feats(), DEFAULT, "default"),
        # order: complexity beats budget beats category
        (feats(complexity=0.9, token_budget=100, category="quick_edit"), STRONG, "rule:complexity_high"),
        (feats(token_budget=100, category="quick_edit"), MID, "rule:token_budget_low"),
        # a named model wins over every tier
        (feats(complexity=0.99, requested_model="sim-llama-8b"), "sim-llama-8b", "rule:explicit"),
        (feats(requested_model="some-unlisted-model"), "some-unlisted-model", "rule:explicit"),
    ],
)
def test_seed_tiers_in_order(policy: RouterPolicy, features: RouteFeatures, model: str, reason: str) -> None:
    decision = decide_route(policy, features)
    assert (decision.model, decision.route_reason) == (model, reason)


def test_fallback_chain_comes_from_the_rule(policy: RouterPolicy) -> None:
    decision = decide_route(policy, feats(complexity=0.9))
    assert decision.fallback_chain == [DEFAULT, MID]
    assert decide_route(policy, feats()).fallback_chain == [MID]


def test_policy_can_override_explicit_model(policy: RouterPolicy) -> None:
    raw = policy.model_dump(mode="json")
    # Free-tier tenants get the small model even when they name another one: a rule before "explicit".
    raw["rules"].insert(0, {"name": "free_tier", "when": {"tenant_tiers": ["free"]}, "target": SMALL})
    custom = RouterPolicy.model_validate(raw)
    assert decide_route(custom, feats(tenant_tier="free", requested_model=STRONG)).model == SMALL
    assert decide_route(custom, feats(tenant_tier="pro", requested_model=STRONG)).model == STRONG


def test_absent_fields_never_match_their_conditions(policy: RouterPolicy) -> None:
    # No budget on the request must not count as "budget < 5000".
    assert decide_route(policy, feats(token_budget=None)).route_reason == "default"


@pytest.mark.parametrize(
    "mutation",
    [
        lambda raw: raw["rules"].append({"name": "x", "target": "no-such-model"}),
        lambda raw: raw["rules"].append({"name": "explicit", "target": "gpt-4.1"}),  # duplicate name
        lambda raw: raw.__setitem__("default", {"target": "nope"}),
        lambda raw: raw["rules"].append({"name": "y", "target": "gpt-4.1", "use_requested_model": True}),
        lambda raw: raw["rules"].append({"name": "z", "target": "gpt-4.1", "when": {"complexity_gt": 2}}),
        lambda raw: raw["rules"].append({"name": "w", "target": "gpt-4.1", "when": {"colour": "red"}}),
    ],
)
def test_bad_policies_fail_validation(policy: RouterPolicy, mutation: object) -> None:
    raw = policy.model_dump(mode="json")
    mutation(raw)  # type: ignore[operator]
    with pytest.raises(ValidationError):
        RouterPolicy.model_validate(raw)


def test_more_conditions_in_one_rule_are_anded(policy: RouterPolicy) -> None:
    raw = policy.model_dump(mode="json")
    raw["rules"].insert(
        0, {"name": "long_code", "target": MID, "when": {"prompt_tokens_gt": 1000, "categories": ["code"]}}
    )
    custom = RouterPolicy.model_validate(raw)
    assert decide_route(custom, feats(prompt_tokens=2000, category="code")).model == MID
    assert decide_route(custom, feats(prompt_tokens=2000, category="chat")).model == DEFAULT
    assert decide_route(custom, feats(prompt_tokens=10, category="code")).model == DEFAULT


def test_prompt_token_rules_count_with_the_per_script_estimate_before_a_model_is_chosen(policy: RouterPolicy) -> None:
    # Before a model is chosen no tokenizer applies: rule features and the scorer's length feature
    # must use the per-script estimate (llmbus.tokens), which counts CJK near a token a character,
    # not 4 characters a token (which would put this 1,280-character prompt at 320, under the rule).
    raw = policy.model_dump(mode="json")
    raw["rules"].insert(0, {"name": "long_prompt", "when": {"prompt_tokens_gt": 1000}, "target": STRONG})
    core = RouterCore(RouterPolicy.model_validate(raw), build_scorer("heuristic"))
    request = InferenceRequest(messages=[ChatMessage(role="user", content="卡夫卡集群中的分区由哪个代理保存" * 80)])
    features = core.features(request)
    assert features.prompt_tokens == estimate_tokens(request.prompt_text()) > 1000
    assert core.decide(request, features).route_reason == "rule:long_prompt"
    # The scorer's length feature reads the same estimate (1.0 at ~1,000 tokens; 320 would give 0.66).
    assert features_of(request.prompt_text())["length"] == 1.0
