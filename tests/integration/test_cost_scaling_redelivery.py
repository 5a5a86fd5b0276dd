"""A scale decision is billed at least once and at most once when Redis fails while cost-accounting handles it.

On the real broker and Redis: the first attempt to count the decision fails as if Redis went
away; the record is not committed past (it is handled again) and the pool's report counts it once.
"""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from llmbus.bus import Bus
from llmbus.contract import topics as t
from llmbus.contract.messages import ScaleDecision, now_ms
from llmbus.settings import BusSettings
from llmbus_services.cost_accounting.app import CostService
from llmbus_services.cost_accounting.config import CostSettings
from llmbus_services.cost_accounting.core.prices import load_pricebook
from llmbus_tools.cost_report import cost_report
from tests.support import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

POOL = "sim-llama-8b"


async def test_a_redis_failure_during_a_scale_decision_is_retried_and_billed_once(bus_settings: BusSettings) -> None:
    svc = CostService(bus_settings, CostSettings(settle_s=0))
    apply_once = svc.store.apply_once
    calls: list[str] = []

    async def redis_away_once(key: str, increments: object) -> bool:
        calls.append(key)
        if len(calls) == 1:
            raise RedisConnectionError("Redis went away mid-decision")
        return await apply_once(key, increments)  # type: ignore[arg-type]

    svc.store.apply_once = redis_away_once  # type: ignore[method-assign,assignment]
    autoscaler = await Bus.start(bus_settings, t.AUTOSCALER)
    await svc.start()
    try:
        at_ms = now_ms()
        decision = ScaleDecision(
            pool=POOL,
            current_replicas=0,
            desired_replicas=2,
            reason="test",
            policy="threshold",
            decided_at_ms=at_ms,
            action="up",
        )
        await autoscaler.publisher.publish(svc.topics.name(t.SCALING), decision, key=POOL)

        async def counted() -> bool:
            report = await cost_report(svc.redis, svc.topics.prefix, load_pricebook(None), at_ms)
            return bool(report["today"]["pool"].get(POOL, {}).get("scale_ups"))

        await eventually(counted, timeout_s=30, interval_s=0.2)
        report = await cost_report(svc.redis, svc.topics.prefix, load_pricebook(None), at_ms)
        row = report["today"]["pool"][POOL]
        assert (row["scale_ups"], row["workers_added"]) == (1, 2)
        assert len(calls) == 2 and calls[0] == calls[1]  # the same decision, handled again
    finally:
        await svc.stop()
        await autoscaler.stop()
