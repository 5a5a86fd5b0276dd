"""The routing core end to end with in-memory fakes for Redis and the budgets topic."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from llmbus.contract.messages import (
    BudgetState,
    BudgetStatus,
    ErrorCode,
    Experiment,
    InferenceRequest,
    ModelSpec,
    ResultStatus,
    Usage,
    Variant,
)
from llmbus.tokens import estimate_tokens, load_tokenizer
from llmbus_services.router.core.budgets import BudgetBook
from llmbus_services.router.core.cache_key import cache_key
from llmbus_services.router.core.complexity import build_scorer
from llmbus_services.router.core.config import RouterPolicy, TenantPolicy, load_policy
from llmbus_services.router.core.experiments import ExperimentBook
from llmbus_services.router.core.pipeline import RouterCore
from llmbus_services.router.core.ports import CachedAnswer, RateDecision


@dataclass
class FakeLimiter:
    allow: bool = True
    calls: list[tuple[str, int]] = field(default_factory=list)

    async def take(self, tenant: str, limits: TenantPolicy, tokens: int) -> RateDecision:
        self.calls.append((tenant, tokens))
        return RateDecision(True) if self.allow else RateDecision(False, retry_after_ms=1234, limit="tokens")


@dataclass
class FakeCache:
    entries: dict[str, CachedAnswer] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)

    async def lookup(self, key: str, pending_id: str | None = None) -> CachedAnswer | None:
        hit = self.entries.get(key)
        if hit is None and pending_id is not None:
            self.pending[pending_id] = key
        return hit


@dataclass
class FakeBudgets:
    states: dict[str, BudgetState] = field(default_factory=dict)
    resets_ms: int | None = None

    def state_of(self, tenant: str) -> BudgetState:
        return self.states.get(tenant, BudgetState.OK)

    def resets_in_ms(self, tenant: str, now_ms: int) -> int | None:
        return self.resets_ms


def core(policy: RouterPolicy | None = None, **kw: object) -> RouterCore:
    policy = policy or load_policy()
    return RouterCore(policy, build_scorer("heuristic"), **kw)  # type: ignore[arg-type]


async def test_routes_by_complexity_and_defaults() -> None:
    c = core()
    out = await c.route(InferenceRequest(prompt="hi", complexity=0.95))
    assert out.routed and out.routed.model == "gpt-4.1" and out.routed.route_reason == "rule:complexity_high"
    out = await c.route(InferenceRequest(prompt="hi"))
    assert out.routed and out.routed.model == "gpt-4.1-mini" and out.routed.route_reason == "default"
    assert out.routed.prompt_tokens_est > 0


async def test_scorer_runs_when_the_caller_gives_no_complexity() -> None:
    hard = (
        "Design a multi-region failover plan. First analyze the trade-offs, then prove the recovery time bound, "
        "ensure at most 5 s of data loss, and explain step by step why each constraint holds."
    )
    out = await core().route(InferenceRequest(prompt=hard))
    assert out.routed and out.routed.model == "gpt-4.1"


async def test_max_tokens_capped_to_model_output_limit() -> None:
    out = await core().route(InferenceRequest(prompt="x", category="quick_edit", max_tokens=50_000))
    assert out.routed and out.routed.request.max_tokens == 1024
    assert out.routed.request.metadata["llmbus.max_tokens_requested"] == "50000"
    assert out.routed.max_tokens_requested == 50_000  # travels to the result, for the output-cap saving
    within = await core().route(InferenceRequest(prompt="x", category="quick_edit", max_tokens=100))
    assert within.routed and within.routed.max_tokens_requested is None


async def test_max_tokens_not_given_is_the_models_cap_within_the_window() -> None:
    """A chat from the OpenAI API without max_tokens: the model's output cap, never a fixed 256."""
    out = await core().route(InferenceRequest(prompt="x", category="quick_edit", max_tokens_auto=True))
    assert out.routed and out.routed.request.max_tokens == 1024  # qwen2.5-coder's max_output_tokens
    assert out.routed.max_tokens_requested is None  # nothing was lowered: nothing was asked
    out = await core().route(InferenceRequest(prompt="x", complexity=0.95, max_tokens_auto=True))
    assert out.routed and out.routed.request.max_tokens == 32768  # gpt-4.1
    # What the prompt leaves of qwen's 8,192 window (counted as the router counts it); none left: refused
    long_prompt = "word " * 7400
    out = await core().route(InferenceRequest(prompt=long_prompt, category="quick_edit", max_tokens_auto=True))
    qwen = load_tokenizer(load_policy().models["qwen2.5-coder-1.5b-instruct"].tokenizer or "")
    assert out.routed and out.routed.request.max_tokens == 8192 - qwen.count(long_prompt)
    assert 500 < out.routed.request.max_tokens < 800
    out = await core().route(InferenceRequest(prompt="word " * 8500, category="quick_edit", max_tokens_auto=True))
    assert out.result and out.result.error and out.result.error.code == ErrorCode.PROMPT_TOO_LONG


async def test_auto_on_the_bus_lets_the_policy_choose() -> None:
    out = await core().route(InferenceRequest(prompt="fix this typo", model="auto", category="quick_edit"))
    assert out.routed and out.routed.model == "qwen2.5-coder-1.5b-instruct"
    assert out.routed.route_reason == "rule:editor_fast"


async def test_max_tokens_reject_when_configured() -> None:
    raw = load_policy().model_dump(mode="json")
    raw["limits"]["over_output_cap"] = "reject"
    out = await core(RouterPolicy.model_validate(raw)).route(InferenceRequest(prompt="x", max_tokens=50_000))
    assert out.routed is None and out.result and out.result.error
    assert out.result.error.code == ErrorCode.MAX_TOKENS_TOO_LARGE and out.result.status == ResultStatus.ERROR


async def test_long_chat_is_trimmed_for_the_small_model() -> None:
    turns = [{"role": "system", "content": "sys"}]
    for i in range(20):
        turns += [{"role": "user", "content": f"q{i} " + "w" * 2000}, {"role": "assistant", "content": "a" * 2000}]
    turns.append({"role": "user", "content": "final"})
    out = await core().route(
        InferenceRequest.model_validate({"messages": turns, "category": "quick_edit", "max_tokens": 512})
    )
    assert out.routed is not None
    assert out.routed.trimmed_tokens > 0
    assert out.routed.prompt_tokens_est <= 8192 - 512
    assert out.routed.request.messages[0].role == "system" and out.routed.request.messages[-1].content == "final"


async def test_prompt_over_hard_cap_is_refused() -> None:
    out = await core().route(InferenceRequest(prompt="p" * 900_000))
    assert out.result and out.result.error and out.result.error.code == ErrorCode.PROMPT_TOO_LONG


async def test_rate_limited_is_a_final_error_with_retry_after() -> None:
    limiter = FakeLimiter(allow=False)
    out = await core(limiter=limiter).route(InferenceRequest(prompt="x" * 400, max_tokens=100, tenant="acme"))
    assert out.routed is None and out.result and out.result.error
    assert out.result.error.code == ErrorCode.RATE_LIMITED and out.result.error.retry_after_ms == 1234
    assert limiter.calls == [("acme", estimate_tokens("x" * 400) + 100)]  # prompt estimate + max_tokens


async def test_over_budget_degrades_or_rejects_per_tenant() -> None:
    raw = load_policy().model_dump(mode="json")
    raw["tenants"]["strict"] = {"over_budget": "reject"}
    policy = RouterPolicy.model_validate(raw)
    budgets = FakeBudgets({"acme": BudgetState.OVER, "strict": BudgetState.OVER, "warned": BudgetState.WARN}, 7_200_000)
    c = core(policy, budgets=budgets)
    out = await c.route(InferenceRequest(prompt="x", complexity=0.99, tenant="acme"))
    assert out.routed and out.routed.model == "llama-3.3-70b-instruct" and out.routed.route_reason == "budget_degrade"
    out = await c.route(InferenceRequest(prompt="x", tenant="strict"))
    assert out.result and out.result.error and out.result.error.code == ErrorCode.OVER_BUDGET
    assert out.result.error.retry_after_ms == 7_200_000  # until its budget period ends
    out = await c.route(InferenceRequest(prompt="x", complexity=0.99, tenant="warned"))
    assert out.routed and out.routed.model == "gpt-4.1"


async def test_cache_hit_is_a_final_cached_result_with_a_content_chunk() -> None:
    cache = FakeCache()
    c = core(cache=cache)
    request = InferenceRequest(prompt="2+2?", temperature=0.0, tenant="acme")
    first = await c.route(request)
    assert first.routed and cache.pending == {request.request_key: cache_key(first.routed.request, "gpt-4.1-mini")}
    cache.entries[cache.pending[request.request_key]] = CachedAnswer(
        text="4", usage=Usage(prompt_tokens=3, completion_tokens=1), model="gpt-4.1-mini"
    )
    again = await c.route(request.model_copy(update={"request_id": "second"}))
    assert again.routed is None and again.result and again.result.cached
    assert again.result.text == "4" and again.result.usage.completion_tokens == 1
    assert [ch.delta for ch in again.content_chunks] == ["4"] and again.last_seq == 0
    # Another tenant with the same bytes misses.
    other = await c.route(request.model_copy(update={"request_id": "third", "tenant": "globex"}))
    assert other.routed is not None and other.result is None


async def test_non_deterministic_requests_skip_the_cache() -> None:
    cache = FakeCache()
    await core(cache=cache).route(InferenceRequest(prompt="tell me a story", temperature=0.9))
    assert cache.pending == {}


async def test_ab_variant_recorded_and_sticky() -> None:
    book = ExperimentBook()
    book.apply(
        Experiment(
            experiment_id="ab1",
            kind="ab",
            salt="s",
            match_models=["gpt-4.1-mini"],
            variants=[
                Variant(name="control", model="gpt-4.1-mini", weight=1),
                Variant(name="treat", model="llama-3.3-70b-instruct", weight=1),
            ],
        )
    )
    c = core(experiments=book)
    seen = {}
    for i in range(200):
        out = await c.route(InferenceRequest(prompt="hello", user_id=f"u{i}"))
        assert out.routed and out.routed.experiment_id == "ab1"
        seen[f"u{i}"] = (out.routed.variant, out.routed.model)
        assert out.routed.model not in out.routed.fallback_chain
    assert {v for v, _ in seen.values()} == {"control", "treat"}
    for user, expected in list(seen.items())[:50]:
        out = await c.route(InferenceRequest(prompt="something else", user_id=user))
        assert out.routed and (out.routed.variant, out.routed.model) == expected
    # The experiment only matches its models.
    out = await c.route(InferenceRequest(prompt="x", complexity=0.99, user_id="u1"))
    assert out.routed and out.routed.experiment_id is None


async def test_shadow_copies_only_for_selected_traffic() -> None:
    book = ExperimentBook()
    book.apply(Experiment(experiment_id="sh", kind="shadow", shadow_model="sim-llama-8b", shadow_share=0.5))
    c = core(experiments=book)
    copies = 0
    for i in range(400):
        out = await c.route(InferenceRequest(prompt="hi", user_id=f"u{i}", reply_topic="llm.tokens"))
        for s in out.shadows:
            copies += 1
            assert s.shadow and s.request.reply_topic == "llm.shadow" and s.model == "sim-llama-8b"
            assert s.request.request_id == f"{out.routed.request_id}.shadow.sh"  # type: ignore[union-attr]
    assert 150 < copies < 250


async def test_unavailable_target_walks_its_chain_and_unknown_models_pass() -> None:
    c = core()
    c.catalog.remove("gpt-4.1-mini")
    out = await c.route(InferenceRequest(prompt="x"))
    assert out.routed and out.routed.model == "llama-3.3-70b-instruct"
    assert out.routed.route_reason == "fallback:gpt-4.1-mini->llama-3.3-70b-instruct:model_unavailable"
    c.catalog.remove("llama-3.3-70b-instruct")
    out = await c.route(InferenceRequest(prompt="x"))
    assert out.result and out.result.error and out.result.error.code == ErrorCode.MODEL_UNAVAILABLE
    out = await c.route(InferenceRequest(prompt="x", model="brand-new"))
    assert out.routed and out.routed.model == "brand-new"


async def test_model_spec_overrides_catalog_limits() -> None:
    c = core()
    c.catalog.apply_spec(ModelSpec(name="qwen2.5-coder-1.5b-instruct", max_model_len=4096, max_output_tokens=64))
    out = await c.route(InferenceRequest(prompt="x", category="quick_edit", max_tokens=500))
    assert out.routed and out.routed.request.max_tokens == 64


@pytest.mark.parametrize("mode", ["reject"])
async def test_unknown_model_rejected_when_configured(mode: str) -> None:
    raw = load_policy().model_dump(mode="json")
    raw["limits"]["unknown_model"] = mode
    out = await core(RouterPolicy.model_validate(raw)).route(InferenceRequest(prompt="x", model="brand-new"))
    assert out.result and out.result.error and out.result.error.code == ErrorCode.MODEL_UNAVAILABLE


def test_a_budget_period_ends_at_utc_midnight_or_the_months_end() -> None:
    book = BudgetBook()
    book.apply(BudgetStatus(tenant="daily", period="day", state=BudgetState.OVER))
    book.apply(BudgetStatus(tenant="monthly", period="month", state=BudgetState.OVER))
    noon_dec_31 = int(datetime(2026, 12, 31, 12, tzinfo=UTC).timestamp() * 1000)
    assert book.resets_in_ms("daily", noon_dec_31) == 12 * 3_600_000
    assert book.resets_in_ms("monthly", noon_dec_31) == 12 * 3_600_000  # the year turns too
    assert book.resets_in_ms("monthly", noon_dec_31 - 30 * 86_400_000) == 31 * 86_400_000 - 12 * 3_600_000
    assert book.resets_in_ms("nobody", noon_dec_31) is None
