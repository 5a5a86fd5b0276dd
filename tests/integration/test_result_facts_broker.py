"""Results and their cost records on the real broker carry the request's facts (session, user, category,
tier), so they are analysed without a join with llm.requests; the scheduler's own final errors too."""

from __future__ import annotations

import hashlib
import hmac
import uuid
from pathlib import Path
from typing import cast

import pytest
import redis.asyncio as redis
import yaml
from aiokafka.structs import ConsumerRecord

from llmbus.bus import decode
from llmbus.client import LlmbusClient, TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    ChatMessage,
    CostRecord,
    ErrorCode,
    ErrorInfo,
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    RoutedRequest,
)
from llmbus.contract.messages.base import now_ms
from llmbus.settings import BusSettings
from llmbus_services.router.core.config import load_policy
from llmbus_services.scheduler.core.scheduler import FinalError
from llmbus_services.scheduler.core.types import SchedRequest
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready
from tests.integration.test_cost_e2e import COST_ENV, results_for
from tests.integration.test_scheduler_handler_faults import make_handlers, namespace, publisher
from tests.support import start_sim_stack

__all__ = ["namespace"]  # the fixture, used by name
SALT = "facts-test-salt"


async def test_a_result_and_its_cost_record_carry_session_user_category_and_tier(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    policy = load_policy().model_dump(mode="json")
    policy["tenants"]["acme"] = {"hash_user_ids": True}
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(policy))
    router_env = {"LLMBUS_ROUTER_POLICY_PATH": str(policy_path), "LLMBUS_ROUTER_USER_ID_SALT": SALT}
    start_sim_stack(bus_settings, services, tmp_path, COST_ENV, router_env)
    await wait_workers_ready(bus_settings, {"w1"}, timeout_s=120)
    topics = t.Topics(bus_settings.topic_prefix)
    results_tail = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    costs_tail = await TopicTail(bus_settings, topics.name(t.COSTS)).start()
    ask = InferenceRequest(
        request_id=f"facts-{uuid.uuid4().hex[:8]}",
        tenant="acme",
        model="sim-llama-8b",
        session_id="sess-1",
        user_id="alice",
        category="chat",
        max_tokens=8,
        messages=[ChatMessage(role="user", content="hello")],
    )
    try:
        async with LlmbusClient(bus_settings) as client:
            async for _ in client.stream(ask, timeout_s=60):
                pass
        found = await results_for(results_tail, {ask.request_id}, timeout_s=60)
        cost, cost_key = None, None
        async for raw in costs_tail.records(60):
            record = cast(ConsumerRecord, raw)  # the tail yields consumer records
            candidate = decode(record, CostRecord)
            if candidate.request_id == ask.request_id:
                cost, cost_key = candidate, record.key
                break
    finally:
        await results_tail.stop()
        await costs_tail.stop()
    result = found[ask.request_id]
    hashed = hmac.new(SALT.encode(), b"alice", hashlib.sha256).hexdigest()
    assert result.status == ResultStatus.OK and result.worker_id == "w1"
    assert (result.session_id, result.user_id, result.category, result.tier) == ("sess-1", hashed, "chat", "sim")
    assert result.route_reason == "rule:explicit"
    assert cost is not None, "no cost record for the result"
    assert (cost.session_id, cost.user_id, cost.category, cost.tier) == ("sess-1", hashed, "chat", "sim")
    assert cost.route_reason == "rule:explicit"
    # keyed by record id (<tenant>:<request id>): a big tenant spreads (docs/topics.md)
    assert cost_key == ask.request_key.encode()


@pytest.mark.redis
async def test_the_schedulers_timeout_result_carries_the_facts(client: redis.Redis, namespace: str) -> None:
    handlers = make_handlers(client, namespace)
    request = InferenceRequest(request_id="r7", prompt="hi", session_id="s", user_id="u", category="quick_edit")
    routed = RoutedRequest(request=request, model="m", route_reason="rule:edit", tier="small", user_ref="h")
    queued = SchedRequest.from_routed(routed, now_ms(), 16, 0)
    async with handlers._lock:
        await handlers._fail(FinalError(queued, ErrorInfo.of(ErrorCode.DEADLINE_EXCEEDED, "deadline passed")))
    [result] = publisher(handlers).of(InferenceResult)
    assert result.error is not None and result.error.code == ErrorCode.DEADLINE_EXCEEDED
    assert (result.session_id, result.user_id, result.category, result.tier) == ("s", "h", "quick_edit", "small")
    assert result.route_reason == "rule:edit"
