"""The router process alone on the real broker and Redis: rules, variants, shadows, limits, budgets.

The test plays client (llm.requests), cost-accounting (llm.budgets), the experiment CLI
(llm.experiments) and scheduler (reads llm.routed); no scheduler or worker runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from aiokafka.structs import ConsumerRecord

from llmbus.bus import Bus, decode
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    BudgetState,
    BudgetStatus,
    ErrorCode,
    Experiment,
    InferenceRequest,
    InferenceResult,
    Message,
    ResultStatus,
    RoutedRequest,
    TokenChunk,
    Variant,
)
from llmbus.settings import BusSettings
from llmbus_services.router.core.config import load_policy
from llmbus_tools.harness.service_procs import ServiceProc

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


def write_policy(tmp_path: Path) -> Path:
    raw = load_policy().model_dump(mode="json", exclude_none=True)
    raw["tenants"] |= {
        "tiny": {"requests_per_s": 0.01, "burst_requests": 2, "tokens_per_min": 1_000_000},
        "strict": {"over_budget": "reject"},
        "saver": {"over_budget": "degrade", "degrade_model": "qwen2.5-coder-1.5b-instruct"},
    }
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


async def read_for(
    tail: TopicTail,
    decode_as: type[Message],
    want: Callable[[list], bool],
    timeout_s: float = 30,
    keep: Callable[[ConsumerRecord], bool] = lambda r: True,
) -> list:
    seen: list = []
    async for record in tail.records(timeout_s):
        if keep(record):
            seen.append(decode(record, decode_as))  # type: ignore[arg-type]
            if want(seen):
                break
    return seen


async def test_router_rules_variants_shadows_limits_and_budgets(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    bus = await Bus.start(bus_settings, t.CLIENT)
    routed_tail = await TopicTail(bus_settings, topics.name(t.ROUTED)).start()
    results_tail = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    tokens_tail = await TopicTail(bus_settings, topics.name(t.TOKENS)).start()
    try:
        # State already in the log before the router starts: it must apply from the first request.
        ab = Experiment(
            experiment_id="ab-mini",
            kind="ab",
            salt="s1",
            match_models=["gpt-4.1-mini"],
            variants=[
                Variant(name="control", model="gpt-4.1-mini", weight=1),
                Variant(name="open", model="llama-3.3-70b-instruct", weight=1),
            ],
        )
        shadow = Experiment(
            experiment_id="sh-strong",
            kind="shadow",
            salt="s2",
            match_models=["gpt-4.1"],
            shadow_model="llama-3.3-70b-instruct",
            shadow_share=1.0,
        )
        for exp in (ab, shadow):
            await bus.publisher.publish(topics.name(t.EXPERIMENTS), exp, key=exp.experiment_id)
        for tenant in ("strict", "saver"):
            await bus.publisher.publish(
                topics.name(t.BUDGETS), BudgetStatus(tenant=tenant, state=BudgetState.OVER), key=tenant
            )
        services.append(
            ServiceProc(
                "llmbus_services.router", bus_settings, env={"LLMBUS_ROUTER_POLICY_PATH": str(write_policy(tmp_path))}
            ).start()
        )

        run = uuid.uuid4().hex[:6]
        cases = {
            f"{run}-strong": (
                InferenceRequest(request_id=f"{run}-strong", prompt="x", complexity=0.9),
                "gpt-4.1",
                "rule:complexity_high",
            ),
            f"{run}-budget": (
                InferenceRequest(request_id=f"{run}-budget", prompt="x", token_budget=1000),
                "llama-3.3-70b-instruct",
                "rule:token_budget_low",
            ),
            f"{run}-edit": (
                InferenceRequest(request_id=f"{run}-edit", prompt="x", category="quick_edit"),
                "qwen2.5-coder-1.5b-instruct",
                "rule:editor_fast",
            ),
            f"{run}-named": (
                InferenceRequest(request_id=f"{run}-named", prompt="x", complexity=0.99, model="sim-llama-8b"),
                "sim-llama-8b",
                "rule:explicit",
            ),
            f"{run}-saver": (
                InferenceRequest(request_id=f"{run}-saver", prompt="x", complexity=0.99, tenant="saver"),
                "qwen2.5-coder-1.5b-instruct",
                "budget_degrade",
            ),
        }
        users = [f"user-{i}" for i in range(24)]
        ab_ids = {f"{run}-ab-{u}-{k}": u for u in users for k in range(2)}
        for request, _, _ in cases.values():
            await bus.publisher.publish(topics.name(t.REQUESTS), request, key=request.request_id)
        for rid, user in ab_ids.items():
            request = InferenceRequest(request_id=rid, prompt=f"hello from {user}", user_id=user)
            await bus.publisher.publish(topics.name(t.REQUESTS), request, key=rid)

        expected = len(cases) + len(ab_ids) + 1  # + the shadow copy of the strong request
        routed: list[RoutedRequest] = await read_for(routed_tail, RoutedRequest, lambda rs: len(rs) >= expected, 60)
        by_id = {r.request_id: r for r in routed}
        for rid, (_, model, reason) in cases.items():
            assert (by_id[rid].model, by_id[rid].route_reason) == (model, reason), rid

        # Sticky variants: both requests of a user got the same variant; both variants were used.
        variant_of: dict[str, set[str]] = {}
        for rid, user in ab_ids.items():
            assert by_id[rid].experiment_id == "ab-mini"
            variant_of.setdefault(user, set()).add(f"{by_id[rid].variant}:{by_id[rid].model}")
        assert all(len(v) == 1 for v in variant_of.values())
        assert {next(iter(v)) for v in variant_of.values()} == {"control:gpt-4.1-mini", "open:llama-3.3-70b-instruct"}

        # The shadow copy: new id, shadow topic, flagged; the client's copy is untouched.
        copy = by_id[f"{run}-strong.shadow.sh-strong"]
        assert copy.shadow and copy.model == "llama-3.3-70b-instruct" and copy.experiment_id == "sh-strong"
        assert copy.request.reply_topic == t.SHADOW_TOKENS
        assert by_id[f"{run}-strong"].request.reply_topic == t.TOKENS and not by_id[f"{run}-strong"].shadow

        # Limits and budgets: final results and a final chunk on the client's reply topic.
        refused = [InferenceRequest(request_id=f"{run}-tiny-{i}", prompt="x", tenant="tiny") for i in range(3)]
        refused.append(InferenceRequest(request_id=f"{run}-strict", prompt="x", tenant="strict"))
        for request in refused:
            await bus.publisher.publish(topics.name(t.REQUESTS), request, key=request.request_id)
        errors: list[InferenceResult] = await read_for(results_tail, InferenceResult, lambda rs: len(rs) >= 2, 30)
        by_code = {r.request_id: r for r in errors}
        # The burst allows two of tiny's three: which one is refused depends on the order the router
        # handles them in, and records of different partitions are handled concurrently.
        tiny = {f"{run}-tiny-{i}" for i in range(3)}
        [limited_id] = [rid for rid in by_code if rid in tiny]
        limited = by_code[limited_id]
        assert limited.status == ResultStatus.ERROR and limited.error is not None
        assert limited.error.code == ErrorCode.RATE_LIMITED and limited.error.retry_after_ms is not None
        assert limited.error.retry_after_ms > 0
        over = by_code[f"{run}-strict"]
        assert over.error is not None and over.error.code == ErrorCode.OVER_BUDGET
        chunks: list[TokenChunk] = await read_for(tokens_tail, TokenChunk, lambda cs: len(cs) >= 2, 30)
        finals = {c.request_id: c for c in chunks if c.final}
        assert finals[limited_id].error is not None and finals[f"{run}-strict"].error is not None
        # The two requests within the burst were routed, not refused.
        more: list[RoutedRequest] = await read_for(routed_tail, RoutedRequest, lambda rs: len(rs) >= 2, 10)
        assert {r.request_id for r in more} == tiny - {limited_id}
    finally:
        for tail in (routed_tail, results_tail, tokens_tail):
            await tail.stop()
        await bus.stop()
