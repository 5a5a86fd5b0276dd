"""Cost-accounting's Redis state check on the real broker and Redis: no false loss when replicas start
together, and a real loss never skips the life of a worker first heard of after it.

1. Replica B (in this process) finds no state id at start; before it reads llm.costs, replica A (a
   process) starts, sets the id and bills hosted results. Nothing was lost: B must not rebuild (before,
   it took A's records for a loss's and made every worker it later priced start at that time -- a
   worker's life billed 0.81x in a loaded parallel run). The order is driven: B's read of where its
   group resumes waits until A's records are on llm.costs.
2. One replica runs; its namespace's state id is deleted (a loss, as this replica sees it); then a
   worker it had never heard of sends its heartbeats. The worker's intervals were never closed by
   anyone: all of its life is billed.
Pass criteria, fixed before the run: every result billed once and each worker's records adding up
to its life's cost exactly (the strict checker); in 1 no "Redis lost" warning, in 2 exactly one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio as redis

from llmbus.audit.bills import check_bills
from llmbus.bus import Bus
from llmbus.bus.admin import open_admin
from llmbus.contract import topics as t
from llmbus.contract.messages import CostRecord, InferenceResult, WorkerStatus
from llmbus.settings import BusSettings
from llmbus.state.keys import cost_key_root
from llmbus.state.store import redis_client
from llmbus_services.cost_accounting.app import CostService
from llmbus_services.cost_accounting.config import CostSettings
from llmbus_tools.harness.service_procs import ServiceProc
from tests.integration.test_cost_e2e import caught_up, hosted_result, instance_cost_micro, read_log
from tests.integration.test_cost_replicas import COST_ENV, LIFE_MS, heartbeats, workload
from tests.support import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.redis]
LOSS_WARNING = "Redis lost cost-accounting's state"


def cost_settings() -> CostSettings:
    return CostSettings(grace_s=1, worker_expiry_s=600, close_every_s=0.2, settle_s=0)


def alone(settings: BusSettings) -> Callable[[], Awaitable[bool]]:
    """Whether one replica reads llm.results (its group stable with one member)."""
    group = t.Topics(settings.topic_prefix).group(t.COST, "results")

    async def check() -> bool:
        async with open_admin(settings) as admin:
            [described] = await asyncio.wait_for(admin.describe_consumer_groups([group]), 10)
        _, _, state, _, _, found = described.groups[0][:6]
        return state == "Stable" and len(found) == 1

    return check


async def publish(bus: Bus, topic: str, messages: list[InferenceResult] | list[WorkerStatus]) -> None:
    """Results keyed by request id, heartbeats by worker."""
    for m in messages:
        await bus.publisher.publish(topic, m, key=m.request_id if isinstance(m, InferenceResult) else m.worker_id)


async def bill_a_worker_life(settings: BusSettings, bus: Bus, client: redis.Redis, run: str, extra: set[str]) -> None:
    """A worker's life replayed into the past (its results first, then its heartbeats): billed exactly,
    with every result in `extra` (billed earlier) billed once too."""
    topics = t.Topics(settings.topic_prefix)
    root = cost_key_root(settings.topic_prefix)
    started_ms = int(time.time() * 1000) - LIFE_MS - 20_000
    pairs = workload(run, "w1", started_ms)
    results = [r for r, _ in pairs]
    await publish(bus, topics.name(t.RESULTS), results)

    async def all_taken() -> bool:
        return int(await client.exists(*[f"{root}seen:{r.request_key}" for r in results])) == len(results)

    await eventually(all_taken, timeout_s=90, interval_s=0.5)
    beats = heartbeats("w1", started_ms, [(at, r.completed_at_ms) for r, at in pairs])
    await publish(bus, topics.name(t.WORKERS), beats)

    async def life_closed() -> bool:
        cursor = await client.hget(f"{root}cursor", "w1")
        return cursor is not None and bool(json.loads(cursor)["waste_booked"])

    result_ids = {r.request_id for r in results} | extra

    async def all_costed() -> bool:
        return result_ids <= {c.request_id for c in await read_log(settings, topics.name(t.COSTS), CostRecord)}

    await eventually(life_closed, timeout_s=120, interval_s=0.5)
    await eventually(all_costed, timeout_s=90, interval_s=1)
    group = topics.group(t.COST, "results")
    await eventually(lambda: caught_up(settings, group, topics.name(t.RESULTS)), timeout_s=90, interval_s=0.5)
    costs = await read_log(settings, topics.name(t.COSTS), CostRecord)
    report = check_bills(costs, result_ids, {"w1": instance_cost_micro(beats[-1])})
    print(f"billed {report.ratio:.4f}x the worker's life; {report}")
    assert report.ok, report
    assert report.ratio == 1.0 and report.billed == len(result_ids)


async def test_a_replica_starting_beside_another_that_bills_rebuilds_nothing(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llmbus_services.cost_accounting")
    topics = t.Topics(bus_settings.topic_prefix)
    root = cost_key_root(bus_settings.topic_prefix)
    b = CostService(bus_settings, cost_settings())
    checking, go = asyncio.Event(), asyncio.Event()
    resume_at = b.handlers.resume_at
    assert resume_at is not None

    async def held_resume_at() -> int | None:  # B has found no state id: A starts and bills now
        checking.set()
        await go.wait()
        return await resume_at()

    b.handlers.resume_at = held_resume_at
    starting = asyncio.create_task(b.start())
    bus = await Bus.start(bus_settings, t.CLIENT)
    client = redis_client(bus_settings.redis_url)
    run = uuid.uuid4().hex[:8]
    try:
        await asyncio.wait_for(checking.wait(), 120)
        a = ServiceProc("llmbus_services.cost_accounting", bus_settings, name="cost-a", env=COST_ENV, log_dir=tmp_path)
        services.append(a.start())
        hosted = [hosted_result(f"{run}-h{i}", "gpt-4.1", 500 + 10 * i, 0, 100) for i in range(24)]
        await publish(bus, topics.name(t.RESULTS), hosted)

        counts = [0]

        async def a_billed() -> bool:
            """A's records on llm.costs, none coming (B's start publishes an outbox it finds: another
            replica's bill in flight would be on llm.costs twice, which the strict checker counts)."""
            counts.append(len(await read_log(bus_settings, topics.name(t.COSTS), CostRecord)))
            return counts[-1] == counts[-2] > 0 and not await client.hlen(f"{root}outbox")

        await eventually(a_billed, timeout_s=120, interval_s=1)
        go.set()
        await asyncio.wait_for(starting, 120)
        a.kill()  # B prices every worker from here on
        await eventually(alone(bus_settings), timeout_s=120, interval_s=0.5)

        await bill_a_worker_life(bus_settings, bus, client, run, {r.request_id for r in hosted})
        assert not [r.message for r in caplog.records if LOSS_WARNING in r.message]
    finally:
        go.set()
        await b.stop()
        await client.aclose()
        await bus.stop()


async def test_a_worker_first_heard_of_after_a_loss_is_billed_its_whole_life(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    root = cost_key_root(bus_settings.topic_prefix)
    a = ServiceProc("llmbus_services.cost_accounting", bus_settings, name="cost-a", env=COST_ENV, log_dir=tmp_path)
    services.append(a.start())
    await eventually(alone(bus_settings), timeout_s=120, interval_s=0.5)
    bus = await Bus.start(bus_settings, t.CLIENT)
    client = redis_client(bus_settings.redis_url)
    run = uuid.uuid4().hex[:8]
    try:
        hosted = [hosted_result(f"{run}-h{i}", "gpt-4.1", 500 + 10 * i, 0, 100) for i in range(4)]
        await publish(bus, topics.name(t.RESULTS), hosted)

        async def billed() -> bool:
            return {r.request_id for r in hosted} <= {
                c.request_id for c in await read_log(bus_settings, topics.name(t.COSTS), CostRecord)
            }

        await eventually(billed, timeout_s=90, interval_s=0.5)
        state = await client.get(f"{root}state")
        await client.delete(f"{root}state")  # the loss, as the running replica sees it (its id is gone)

        async def rebuilt() -> bool:
            return LOSS_WARNING in a.log_path.read_text(errors="replace")

        await eventually(rebuilt, timeout_s=60, interval_s=0.5)
        assert await client.get(f"{root}state") not in (None, state)

        await bill_a_worker_life(bus_settings, bus, client, run, {r.request_id for r in hosted})
        assert a.log_path.read_text(errors="replace").count(LOSS_WARNING) == 1
    finally:
        await client.aclose()
        await bus.stop()
