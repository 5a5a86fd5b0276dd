"""Redis loses its last writes (a restart from an append-only file fsynced every second, a failover to a
replica behind): cost-accounting notices at its next tick and applies again, from llm.costs, what it
had applied in the lost tail.

Here the loss is made exact on the real Redis: the namespace's keys are copied (DUMP) after a first
result is billed, two more are billed, and the copy is put back in place of everything (RESTORE):
what Redis acknowledged after the copy is gone, cost-accounting's state id is not. Pass criteria,
fixed before the run: after the next tick, the Redis totals (per tenant: µUSD and requests) equal the
three records on llm.costs, each record is on llm.costs once (nothing published again), and the two
results billed after the copy are marked seen again (a redelivery of them bills nothing).
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
from llmbus.state.keys import cost_key_root, glob_literal
from llmbus_services.cost_accounting.app import CostService
from llmbus_services.cost_accounting.config import CostSettings
from tests.integration.test_cost_handlers import hosted, send_result
from tests.support import redis_keys

pytestmark = pytest.mark.redis


async def test_writes_redis_lost_after_acknowledging_them_are_applied_again_from_llm_costs(redis_up: None) -> None:
    settings = BusSettings(topic_prefix=f"t{uuid.uuid4().hex[:10]}.", log_json=False)
    bus = MemoryBus(settings)
    service = CostService(settings, CostSettings(interval_s=60, grace_s=1, settle_s=0), bus.runtime(contracts.COST))
    redis = service.redis
    pattern = glob_literal(cost_key_root(settings.topic_prefix)) + "*"  # every key cost-accounting writes
    billed = bus.spy(service.topics.name(t.COSTS), CostRecord)

    async def on_llm_costs(since_ms: int) -> list[CostRecord]:
        return list(billed)  # all of it was written after since_ms (the records' own times are the results')

    service.handlers.billed_since = on_llm_costs
    try:
        await service.handlers.restore()
        await service.tick()
        await send_result(service, bus, hosted("r1"))
        await service.tick()
        kept = {key: (await redis.dump(key), await redis.pttl(key)) for key in await redis_keys(redis, pattern)}
        await send_result(service, bus, hosted("r2"))
        await send_result(service, bus, hosted("r3"))
        await service.tick()

        await redis.delete(*await redis_keys(redis, pattern))  # Redis comes back with the copy only
        for key, (dumped, ttl_ms) in kept.items():
            await redis.restore(key, max(ttl_ms, 0), dumped)
        assert await service.store.seen([hosted("r2"), hosted("r3")]) == [False, False]

        await service.tick()  # notices its tick count went back, applies llm.costs again
        counts = Counter(record.record_id for record in billed)
        assert counts == Counter({"acme:r1": 1, "acme:r2": 1, "acme:r3": 1})  # nothing published twice
        totals = {
            tenant: (cost, requests) for tenant, (cost, requests) in (await tenant_totals(service, settings)).items()
        }
        assert totals == {"acme": (sum(r.cost_micro_usd for r in billed), 3)}
        assert await service.store.seen([hosted("r2"), hosted("r3")]) == [True, True]
    finally:
        if keys := await redis_keys(redis, pattern):
            await redis.delete(*keys)
        await redis.aclose()


async def tenant_totals(service: CostService, settings: BusSettings) -> dict[str, tuple[int, int]]:
    cost, requests = Counter[str](), Counter[str]()
    for key in await redis_keys(service.redis, glob_literal(cost_key_root(settings.topic_prefix)) + "agg:m*:tenant"):
        for field, value in (await service.redis.hgetall(key)).items():
            tenant, _, metric = field.decode().rpartition("|")
            if metric == "cost":
                cost[tenant] += int(value)
            elif metric == "requests":
                requests[tenant] += int(value)
    return {tenant: (cost[tenant], requests[tenant]) for tenant in cost}
