"""Per-tier TTFT targets end to end: the router reads slow results from llm.results, reports the miss,
and (prefer_fallback_while_missing) routes that tier's requests to their fallback."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from llmbus.bus import Bus, decode
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceRequest, InferenceResult, ResultStatus, RoutedRequest, Timings
from llmbus.settings import BusSettings
from llmbus_services.router.core.config import load_policy
from llmbus_tools.harness.service_procs import ServiceProc
from tests.support import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.redis]
SLOW_MODEL = "llama-3.3-70b-instruct"  # tier mid, target 800 ms


def write_policy(tmp_path: Path) -> Path:
    raw = load_policy().model_dump(mode="json", exclude_none=True)
    raw["latency"] |= {"min_samples": 3, "window_s": 120, "prefer_fallback_while_missing": True}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


async def routed_by_id(tail: TopicTail, request_id: str, timeout_s: float) -> RoutedRequest | None:
    async for record in tail.records(timeout_s):
        routed = decode(record, RoutedRequest)
        if routed.request_id == request_id:
            return routed
    return None


async def test_a_tier_missing_its_ttft_target_is_reported_and_avoided(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    bus = await Bus.start(bus_settings, t.CLIENT)
    routed_tail = await TopicTail(bus_settings, topics.name(t.ROUTED)).start()
    router = ServiceProc(
        "llmbus_services.router", bus_settings, env={"LLMBUS_ROUTER_POLICY_PATH": str(write_policy(tmp_path))}
    ).start()
    services.append(router)
    run = uuid.uuid4().hex[:6]

    async def route(n: int, timeout_s: float = 60) -> RoutedRequest:
        req = InferenceRequest(request_id=f"{run}-{n}", prompt="hi", token_budget=1000)  # rule token_budget_low
        await bus.publisher.publish(topics.name(t.REQUESTS), req, key=req.request_id)
        routed = await routed_by_id(routed_tail, req.request_id, timeout_s)
        assert routed is not None, f"request {n} was not routed"
        return routed

    try:
        first = await route(0, timeout_s=180)  # the router's start (imports, group joins, state catch-up)
        assert first.model == SLOW_MODEL and first.route_reason == "rule:token_budget_low"
        assert first.request.metadata["llmbus.tier"] == "mid"
        assert first.request.metadata["llmbus.latency_target_ms"] == "800"
        for i in range(4):  # the engine answers, slowly: TTFT 3 s against mid's 800 ms
            slow = InferenceResult(
                request_id=f"{run}-slow-{i}",
                tenant="default",
                status=ResultStatus.OK,
                model=SLOW_MODEL,
                timings=Timings(ttft_ms=3000.0, total_ms=4000.0),
            )
            await bus.publisher.publish(topics.name(t.RESULTS), slow, key=slow.request_id)
        avoided: list[RoutedRequest] = []

        async def rerouted() -> bool:
            routed = await route(len(avoided) + 1)
            avoided.append(routed)
            return routed.model != SLOW_MODEL

        await eventually(rerouted, timeout_s=60, interval_s=0.2)
        last = avoided[-1]
        assert last.model == "gpt-4.1-mini"
        assert last.route_reason == f"latency_fallback:{SLOW_MODEL}->gpt-4.1-mini:mid"
        assert last.request.metadata["llmbus.tier"] == "default"

        async def reported() -> bool:
            # logged once, when the third slow result (min_samples) turns the tier to missing
            return "tier mid: TTFT p90 3000 ms vs target 800 ms over 3 results: MISSING" in router.log_tail(400)

        await eventually(reported, timeout_s=10)
    finally:
        await routed_tail.stop()
        await bus.stop()
