"""Budgets that bite, end to end on the real broker: cost-accounting publishes BudgetStatus on
llm.budgets and the router (a real process) degrades or rejects the tenant within seconds."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import yaml

from llmbus.bus import Bus, decode
from llmbus.client import TopicTail, collect_results
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    ErrorCode,
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    RoutedRequest,
    Usage,
)
from llmbus.settings import BusSettings
from llmbus_services.router.core.config import DEFAULT_POLICY_PATH
from llmbus_tools.harness.service_procs import ServiceProc

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


async def routed_of(tail: TopicTail, request_id: str, timeout_s: float) -> RoutedRequest | None:
    async for record in tail.records(timeout_s):
        routed = decode(record, RoutedRequest)  # type: ignore[arg-type]
        if routed.request_id == request_id:
            return routed
    return None


async def test_tenant_over_budget_is_degraded_or_rejected_within_seconds(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("tenants:\n  capped: {limit_usd: 0.01, period: day}\n  strict: {limit_usd: 0.01, period: day}\n")
    policy = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    policy["tenants"]["strict"] = {"over_budget": "reject"}
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(policy))
    services.append(
        ServiceProc(
            "llmbus_services.cost_accounting",
            bus_settings,
            log_dir=tmp_path,
            env={"LLMBUS_COST_BUDGETS_PATH": str(budgets)},
        ).start()
    )
    services.append(
        ServiceProc(
            "llmbus_services.router",
            bus_settings,
            log_dir=tmp_path,
            env={"LLMBUS_ROUTER_POLICY_PATH": str(policy_path), "LLMBUS_CATCH_UP_S": "2"},
        ).start()
    )
    topics = t.Topics(bus_settings.topic_prefix)
    bus = await Bus.start(bus_settings, t.CLIENT)
    routed_tail = await TopicTail(bus_settings, topics.name(t.ROUTED)).start()
    results_tail = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    run = uuid.uuid4().hex[:8]

    async def ask(tenant: str, n: int) -> InferenceRequest:
        request = InferenceRequest(request_id=f"{run}-{tenant}-{n}", tenant=tenant, model="gpt-4.1", prompt="hi")
        await bus.publisher.publish(topics.name(t.REQUESTS), request, key=request.request_id)
        return request

    try:
        first = await ask("capped", 0)
        routed = await routed_of(routed_tail, first.request_id, timeout_s=60)  # the router is up
        assert routed is not None and routed.model == "gpt-4.1" and routed.route_reason != "budget_degrade"

        # $0.0114 of hosted spend (2 x 5,700 µUSD) for each tenant: past 100 % of $0.01
        for tenant in ("capped", "strict"):
            for i in range(2):
                spent = InferenceResult(
                    request_id=f"{run}-{tenant}-spend-{i}",
                    tenant=tenant,
                    status=ResultStatus.OK,
                    model="gpt-4.1",
                    worker_id="openai-1",
                    usage=Usage(prompt_tokens=1000, cached_prompt_tokens=200, completion_tokens=500),
                )
                await bus.publisher.publish(topics.name(t.RESULTS), spent, key=spent.request_id)
        crossed_at = time.monotonic()

        # Asked again and again until degraded or 15 s have passed (a count of asks would end sooner on
        # a fast machine than the budget can travel results -> costs -> aggregates -> llm.budgets -> router).
        degraded_after_s = None
        n = 0
        while time.monotonic() - crossed_at < 15:
            n += 1
            request = await ask("capped", n)
            routed = await routed_of(routed_tail, request.request_id, timeout_s=5)
            assert routed is not None
            if routed.route_reason == "budget_degrade":
                degraded_after_s = time.monotonic() - crossed_at
                ranks = {name: entry["cost_rank"] for name, entry in policy["models"].items()}
                assert ranks[routed.model] < ranks["gpt-4.1"]  # a cheaper model than the one asked for
                break
            await asyncio.sleep(0.1)
        assert degraded_after_s is not None and degraded_after_s < 15, degraded_after_s

        rejected = None
        for n in range(1, 20):
            request = await ask("strict", n)
            found = await collect_results(bus_settings, {request.request_id}, timeout_s=2, tail=results_tail)
            if found.get(request.request_id):
                rejected = found[request.request_id][0]
                break
        assert rejected is not None and rejected.status == ResultStatus.ERROR
        assert rejected.error is not None and rejected.error.code == ErrorCode.OVER_BUDGET
        print(f"degraded {degraded_after_s:.2f} s after the spend crossing 100 % was published")
    finally:
        await routed_tail.stop()
        await results_tail.stop()
        await bus.stop()
