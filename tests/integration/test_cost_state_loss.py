"""Redis loses cost-accounting's state between two runs: what was billed is not billed again.

Two runs of the service on one namespace (llmbus.bus.memory, the real Redis). The first bills a
result; then every key of the namespace is deleted (a flushed Redis, as far as this namespace
knows) and a second run starts and reads that result again, as it does after a crash: its markers
are gone. Pass criterion, fixed before the run: the second run rebuilds the markers from what is on
llm.costs (given here as the first run's records) and bills only the result that has no record --
one record per result over both runs.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from llmbus.bus.memory import MemoryBus
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import CostRecord
from llmbus.settings import BusSettings
from llmbus.state.keys import cost_key_root
from llmbus_services.cost_accounting.app import CostService
from llmbus_services.cost_accounting.config import CostSettings
from tests.integration.test_cost_handlers import NOW, hosted, send_result
from tests.support import redis_keys

pytestmark = pytest.mark.redis


async def test_a_result_billed_before_the_loss_and_read_again_after_it_is_billed_once(redis_up: None) -> None:
    settings = BusSettings(topic_prefix=f"t{uuid.uuid4().hex[:10]}.", log_json=False)
    cost = CostSettings(interval_s=60, grace_s=1, settle_s=0)
    first_bus, second_bus = MemoryBus(settings), MemoryBus(settings)
    first = CostService(settings, cost, first_bus.runtime(contracts.COST))
    second = CostService(settings, cost, second_bus.runtime(contracts.COST))
    try:
        billed_first = first_bus.spy(first.topics.name(t.COSTS), CostRecord)
        billed_second = second_bus.spy(second.topics.name(t.COSTS), CostRecord)
        await first.handlers.restore()
        await send_result(first, first_bus, hosted("r1"))
        assert [c.request_id for c in billed_first] == ["r1"]

        await first.redis.delete(*await redis_keys(first.redis, f"{cost_key_root(settings.topic_prefix)}*"))  # the loss

        async def on_llm_costs(since_ms: int) -> list[CostRecord]:
            assert since_ms <= NOW  # from before the oldest result read again
            return list(billed_first)

        async def resume_at() -> int:
            return NOW

        second.handlers.billed_since = on_llm_costs
        second.handlers.resume_at = resume_at
        await second.handlers.restore()
        await send_result(second, second_bus, hosted("r1"))  # read again: its offset was not committed
        await send_result(second, second_bus, hosted("r2"))
        records = Counter(c.record_id for c in [*billed_first, *billed_second])
        assert records == Counter({"acme:r1": 1, "acme:r2": 1}), records
    finally:
        for svc in (first, second):
            if keys := await redis_keys(svc.redis, f"{cost_key_root(settings.topic_prefix)}*"):
                await svc.redis.delete(*keys)
            await svc.redis.aclose()
