"""A worker's GPU-time owner dies mid-life: another replica takes over from the saved cursor.

Two cost-accounting services in memory (an llmbus.bus.memory log each) on the real Redis,
one namespace. Each reads its own share of the worker's results; the lease holder prices them
all. Its lease then runs out (its process is gone: it ticks no more), the other replica takes the
worker over from the cursor and the held results and closes the rest of the life. Every result
is billed once and the worker's records add up to its life's cost exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest

from llmbus.audit.bills import check_bills
from llmbus.bus.memory import MemoryBus
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    CostRecord,
    InferenceResult,
    ResultStatus,
    Timings,
    Usage,
    WorkerState,
    WorkerStatus,
)
from llmbus.settings import BusSettings
from llmbus_services.cost_accounting.app import CostService
from llmbus_services.cost_accounting.config import CostSettings
from tests.integration.test_cost_e2e import instance_cost_micro
from tests.support import eventually
from tests.unit.test_cost_ledger import heartbeat

pytestmark = pytest.mark.redis
NOW = 1_780_000_000_000
START = NOW - NOW % 60_000
LEASE_S = 0.3


@contextlib.asynccontextmanager
async def replica(settings: BusSettings, costs: list[CostRecord]) -> AsyncIterator[tuple[CostService, MemoryBus]]:
    bus = MemoryBus(settings)
    svc = CostService(settings, CostSettings(interval_s=60, grace_s=1, settle_s=0), bus.runtime(contracts.COST))
    svc.handlers.lease_ms = int(LEASE_S * 1000)
    bus.log.spies.setdefault(svc.topics.name(t.COSTS), []).append((CostRecord, costs))  # both replicas' records
    try:
        yield svc, bus
    finally:
        await svc.redis.aclose()


def beat(sent_ms: int, state: WorkerState = WorkerState.READY) -> WorkerStatus:
    return heartbeat("w1", START, sent_ms, 0.0, state)


def served(rid: str, start_ms: int, end_ms: int) -> InferenceResult:
    return InferenceResult(
        request_id=rid,
        tenant="acme",
        status=ResultStatus.OK,
        model="sim-llama-8b",
        worker_id="w1",
        usage=Usage(prompt_tokens=300, completion_tokens=120),
        timings=Timings(engine_ms=float(end_ms - start_ms)),
        completed_at_ms=end_ms,
    )


async def test_a_new_owner_continues_the_life_from_the_cursor(redis_up: None) -> None:
    settings = BusSettings(topic_prefix=f"t{uuid.uuid4().hex[:10]}.", log_json=False)
    costs: list[CostRecord] = []
    async with replica(settings, costs) as (a, bus_a), replica(settings, costs) as (b, bus_b):
        try:

            async def to_both(status: WorkerStatus) -> None:
                for bus, svc in ((bus_a, a), (bus_b, b)):
                    await bus.send(svc.topics.name(t.WORKERS), status, key="w1")

            async def result_to(svc: CostService, bus: MemoryBus, r: InferenceResult) -> None:
                await bus.send(svc.topics.name(t.RESULTS), r, key=r.request_id)

            await to_both(beat(START + 1000))
            assert await a.handlers.tick(START + 1000, 60_000) == 0  # a takes the lease
            await b.handlers.tick(START + 1000, 60_000)
            assert a.handlers._owned == {"w1"} and b.handlers._owned == set()
            # first interval: one result read by each replica, both priced by a
            await result_to(a, bus_a, served("r1", START + 5_000, START + 20_000))
            await result_to(b, bus_b, served("r2", START + 10_000, START + 40_000))
            # r3 spans the first two intervals; r4 ends in the second
            await result_to(b, bus_b, served("r3", START + 50_000, START + 70_000))
            await to_both(beat(START + 60_500))  # (these beats do not say what runs: results are all in)
            await to_both(beat(START + 62_000))
            await a.handlers.tick(START + 62_000, 60_000)
            await b.handlers.tick(START + 62_000, 60_000)
            assert {c.request_id for c in costs if c.kind == "self_hosted"} == {"r1", "r2"}
            # a's process is gone: it ticks no more; its lease runs out and b takes the worker over
            await result_to(a, bus_a, served("r4", START + 80_000, START + 100_000))
            await asyncio.sleep(LEASE_S * 2)
            await to_both(beat(START + 120_000, WorkerState.STOPPED))

            async def taken_over() -> bool:
                await b.handlers.tick(START + 200_000, 60_000)
                return b.handlers._owned == {"w1"}

            await eventually(taken_over, timeout_s=5)
            report = check_bills(costs, ["r1", "r2", "r3", "r4"], {"w1": instance_cost_micro(beat(START + 120_000))})
            assert report.ok, report
            r3 = next(c for c in costs if c.request_id == "r3")
            assert r3.gpu_busy_ms == 20_000  # its share of the first interval was in the cursor
        finally:
            async for key in a.redis.scan_iter(match=f"{settings.topic_prefix}*"):
                await a.redis.delete(key)
