"""Ordered routing rules (pure): the first rule whose conditions hold picks the model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llmbus_services.router.core.config import RouterPolicy, Rule, RuleWhen


@dataclass(frozen=True)
class RouteFeatures:
    """What the rules look at, computed once per request."""

    complexity: float
    prompt_tokens: int
    token_budget: int | None = None
    category: str | None = None
    tenant: str = "default"
    tenant_tier: str | None = None
    requested_model: str | None = None


@dataclass(frozen=True)
class RouteDecision:
    model: str
    fallback_chain: list[str] = field(default_factory=list)
    route_reason: str = "default"
    rule: str | None = None


def rule_matches(when: RuleWhen, f: RouteFeatures) -> bool:
    # A condition on a field the request does not carry (token budget, category, tier) is false:
    # a rule for "budget < 5000" must not catch requests that set no budget at all.
    checks: list[Callable[[], bool]] = []
    if when.complexity_gt is not None:
        checks.append(lambda: f.complexity > when.complexity_gt)  # type: ignore[operator]
    if when.complexity_lt is not None:
        checks.append(lambda: f.complexity < when.complexity_lt)  # type: ignore[operator]
    if when.prompt_tokens_gt is not None:
        checks.append(lambda: f.prompt_tokens > when.prompt_tokens_gt)  # type: ignore[operator]
    if when.prompt_tokens_lt is not None:
        checks.append(lambda: f.prompt_tokens < when.prompt_tokens_lt)  # type: ignore[operator]
    if when.token_budget_lt is not None:
        checks.append(lambda: f.token_budget is not None and f.token_budget < when.token_budget_lt)  # type: ignore[operator]
    if when.token_budget_gt is not None:
        checks.append(lambda: f.token_budget is not None and f.token_budget > when.token_budget_gt)  # type: ignore[operator]
    if when.categories is not None:
        checks.append(lambda: f.category in when.categories)  # type: ignore[operator]
    if when.tenant_tiers is not None:
        checks.append(lambda: f.tenant_tier in when.tenant_tiers)  # type: ignore[operator]
    if when.tenants is not None:
        checks.append(lambda: f.tenant in when.tenants)  # type: ignore[operator]
    if when.model_named is not None:
        checks.append(lambda: (f.requested_model is not None) == when.model_named)
    if when.models is not None:
        checks.append(lambda: f.requested_model in when.models)  # type: ignore[operator]
    return all(check() for check in checks)


def _decision(rule: Rule, f: RouteFeatures) -> RouteDecision:
    model = f.requested_model if rule.use_requested_model else rule.target
    assert model is not None  # guaranteed by Rule's validator and the model_named condition below
    chain = [m for m in rule.fallback if m != model]
    return RouteDecision(model=model, fallback_chain=chain, route_reason=f"rule:{rule.name}", rule=rule.name)


def decide_route(policy: RouterPolicy, f: RouteFeatures) -> RouteDecision:
    for rule in policy.rules:
        if rule.use_requested_model and f.requested_model is None:
            continue  # "use the requested model" cannot apply when none is named
        if rule_matches(rule.when, f):
            return _decision(rule, f)
    default = policy.default
    return RouteDecision(
        model=default.target,
        fallback_chain=[m for m in default.fallback if m != default.target],
        route_reason="default",
    )
