"""Cost-accounting sees the autoscaler: scale decisions on llm.scaling counted per pool, once each.

The handler runs in memory (llmbus.bus.memory) against the real Redis, where the
once-only marker and the aggregates live; `llmbus costs --view pool` reads the same report.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from llmbus.bus.memory import MemoryBus
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import ScaleDecision
from llmbus.settings import BusSettings
from llmbus_services.cost_accounting.app import CostService
from llmbus_services.cost_accounting.config import CostSettings
from llmbus_services.cost_accounting.core.prices import load_pricebook
from llmbus_tools.cost_report import cost_report
from tests.support import redis_keys

NOW = 1_780_000_000_000

pytestmark = [pytest.mark.redis]


@pytest.fixture
async def service(redis_up: None) -> AsyncIterator[tuple[CostService, MemoryBus]]:
    settings = BusSettings(topic_prefix=f"t{uuid.uuid4().hex[:10]}.", log_json=False)
    bus = MemoryBus(settings)
    svc = CostService(settings, CostSettings(settle_s=0), bus.runtime(contracts.COST))
    yield svc, bus
    if keys := await redis_keys(svc.redis, f"{settings.topic_prefix}*"):
        await svc.redis.delete(*keys)
    await svc.redis.aclose()


def decision(current: int, desired: int, at_ms: int, pool: str = "sim-llama-8b") -> ScaleDecision:
    action = "up" if desired > current else "down" if desired < current else "hold"
    return ScaleDecision(
        pool=pool,
        current_replicas=current,
        desired_replicas=desired,
        reason="test",
        policy="threshold",
        decided_at_ms=at_ms,
        action=action,
    )


async def test_scale_events_counted_per_pool_once_each(service: tuple[CostService, MemoryBus]) -> None:
    svc, bus = service
    topic = svc.topics.name(t.SCALING)
    for d in [
        decision(0, 1, NOW),
        decision(1, 3, NOW + 60_000),
        decision(3, 3, NOW + 90_000),
        decision(3, 0, NOW + 900_000),
    ]:
        await bus.send(topic, d, key=d.pool)
    await bus.send(topic, decision(1, 3, NOW + 60_000), key="sim-llama-8b")  # redelivered

    report = await cost_report(svc.redis, svc.topics.prefix, load_pricebook(None), NOW)
    row = report["today"]["pool"]["sim-llama-8b"]
    assert (row["scale_ups"], row["scale_downs"]) == (2, 1)  # the hold is not an event; the copy counts once
    assert (row["workers_added"], row["workers_removed"]) == (3, 3)
    assert report["this_month"]["pool"]["sim-llama-8b"]["scale_ups"] == 2
