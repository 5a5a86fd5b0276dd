"""cost-accounting's own wiring (CostService on the runtime) in memory and on the real broker: a hosted result
billed once however often it comes, a record that does not decode dead-lettered with its reason."""

from __future__ import annotations

import pytest

from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import CostKind, CostRecord, DeadLetter
from llmbus_services.cost_accounting.app import CostService
from llmbus_services.cost_accounting.config import CostSettings
from tests.fixtures.buses import EitherBus
from tests.integration.test_cost_handlers import hosted
from tests.support import redis_keys

pytestmark = pytest.mark.redis


async def test_a_hosted_result_is_billed_once_and_a_bad_record_is_dead_lettered(on_bus: EitherBus) -> None:
    topics = on_bus.topics
    results = topics.name(t.RESULTS)
    runtime = await on_bus.runtime(contracts.COST)
    svc = CostService(on_bus.settings, CostSettings(settle_s=0), runtime)
    await on_bus.start(runtime)
    try:
        await on_bus.send(results, hosted("r1"), key="k")
        await on_bus.send(results, hosted("r1"), key="k")  # delivered again: billed once
        await on_bus.send(results, b"not json", key="k")
        await on_bus.send(results, hosted("r2"), key="k")  # the same partition: after all of them
        costs = await on_bus.published(
            topics.name(t.COSTS), CostRecord, until=lambda found: any(c.request_id == "r2" for c in found)
        )
        assert sorted(c.request_id for c in costs) == ["r1", "r2"]
        assert {c.kind for c in costs} == {CostKind.HOSTED} and costs[0].cost_micro_usd == 5700
        [letter] = await on_bus.published(topics.name(t.DLQ), DeadLetter, until=lambda found: len(found) >= 1)
        assert letter.source_topic == results and letter.error_code == "malformed"
        assert not runtime.contract.undeclared(topics, runtime.publisher.topics_written)
    finally:
        if keys := await redis_keys(svc.redis, f"{on_bus.settings.topic_prefix}*"):
            await svc.redis.delete(*keys)
