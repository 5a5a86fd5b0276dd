"""A result held while the ledger's owner reads the held results is priced once.

One cost-accounting service in memory (llmbus.bus.memory) on the real Redis. The handler of
llm.results holds a result in Redis, then hands it to the ledger; a tick reading the held results
in between (a restart or a takeover reads many: a long read) found it held but not in the ledger
and added it too. The interval's close then priced it twice under one record id: the first copy
with the request's GPU share, the second with what was left of it (0 µUSD), and both went to
llm.costs (the totals counted the first: a reader keeping the last copy saw the request free).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from llmbus.audit.bills import check_bills
from llmbus.bus.memory import MemoryBus
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import CostRecord, InferenceResult, WorkerState
from llmbus.settings import BusSettings
from llmbus_services.cost_accounting.app import CostService
from llmbus_services.cost_accounting.config import CostSettings
from tests.integration.test_cost_e2e import instance_cost_micro
from tests.integration.test_cost_takeover import START, beat, served

pytestmark = pytest.mark.redis


async def test_a_result_held_during_the_ticks_read_is_priced_once(redis_up: None) -> None:
    settings = BusSettings(topic_prefix=f"t{uuid.uuid4().hex[:10]}.", log_json=False)
    bus = MemoryBus(settings)
    svc = CostService(settings, CostSettings(interval_s=60, grace_s=1, settle_s=0), bus.runtime(contracts.COST))
    costs: list[CostRecord] = []
    bus.log.spies.setdefault(svc.topics.name(t.COSTS), []).append((CostRecord, costs))
    store = svc.handlers.store
    try:
        await bus.send(svc.topics.name(t.WORKERS), beat(START + 1000), key="w1")
        await svc.handlers.tick(START + 1000, 60_000)
        assert svc.handlers._owned == {"w1"}
        # The handler of llm.results stops right after holding r1 (before the ledger takes it) ...
        held, go_on = asyncio.Event(), asyncio.Event()
        hold, held_results = store.hold, store.held_results

        async def hold_then_wait(results: list[tuple[InferenceResult, bytes]]) -> None:
            await hold(results)
            held.set()
            await go_on.wait()

        # ... and goes on while the tick reads the held results (their bytes: the slow part).
        async def read_while_handler_goes_on(worker_id: str, request_ids: list[str]) -> list[InferenceResult]:
            found = await held_results(worker_id, request_ids)
            go_on.set()
            await reading
            return found

        store.hold = hold_then_wait  # type: ignore[method-assign]
        store.held_results = read_while_handler_goes_on  # type: ignore[method-assign]
        r1 = served("r1", START + 5_000, START + 20_000)
        reading = asyncio.create_task(bus.send(svc.topics.name(t.RESULTS), r1, key="r1"))
        await asyncio.wait_for(held.wait(), timeout=5)
        for sent_ms in (START + 60_500, START + 62_000):  # the first interval closes on this tick
            await bus.send(svc.topics.name(t.WORKERS), beat(sent_ms), key="w1")
        await asyncio.wait_for(svc.handlers.tick(START + 62_000, 60_000), timeout=5)
        await asyncio.wait_for(reading, timeout=5)
        copies = [c for c in costs if c.request_id == "r1"]
        assert [c.cost_micro_usd > 0 for c in copies] == [True], copies
        # the worker stops: its whole life is billed once, to the micro-dollar
        store.hold, store.held_results = hold, held_results  # type: ignore[method-assign]
        await bus.send(svc.topics.name(t.WORKERS), beat(START + 90_000, WorkerState.STOPPED), key="w1")
        await svc.handlers.tick(START + 200_000, 60_000)
        report = check_bills(costs, ["r1"], {"w1": instance_cost_micro(beat(START + 90_000))})
        assert report.ok, report
    finally:
        async for key in svc.redis.scan_iter(match=f"{settings.topic_prefix}*"):
            await svc.redis.delete(key)
        await svc.redis.aclose()
