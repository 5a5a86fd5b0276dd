"""The whole stack on a Redis Cluster (three primaries, a replica each, a private one; every service with
LLMBUS_REDIS_CLUSTER): mid-load a primary is SIGKILLed; its replica takes its slots over after the
node timeout (2 s), and the killed node is started again as the new primary's replica.

While the slots move, commands to them fail (connection refused, CLUSTERDOWN, MOVED): transient
(llmbus.state.errors), retried in place, placements tried again. Replication is asynchronous: the
replica may lack the primary's last writes; cost-accounting finds its tick count gone back and
applies llm.costs again. Errors allowed, fixed before the run, for the requests sent from 2 s before
the kill until the killed node is back as a replica, at most one each: `max_attempts` (a worker that could not claim its
result handed the request back attempt after attempt). Every result billed once, the money conserved."""

from __future__ import annotations

import asyncio
import time

from llmbus_tools.harness.reliability.infra import PrivateRedisCluster
from llmbus_tools.harness.reliability.load import Load
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, at, deployed, run_scenario
from tests.reliability.scenarios.redis_restart import LOAD_S, exposed_to


async def run(run: Run) -> Outcome:
    cluster = PrivateRedisCluster(run.log_dir / "redis-cluster")
    await asyncio.to_thread(cluster.start)
    try:
        deployment = run.deployment(redis_url=cluster.url, redis_cluster=True)
        faults = Faults()
        budget = ErrorBudget()
        size = run.size
        load = Load(deployment, size.requests, min(size.rate_per_s, size.requests / LOAD_S))  # runs through the fault

        async def failover() -> None:
            before = len(load.sent_ids)
            began = time.monotonic()
            victim = await asyncio.to_thread(cluster.fail_primary)
            promoted_s = time.monotonic() - began
            await asyncio.to_thread(cluster.restart, victim)
            exposed = exposed_to(load, before)  # until the killed node is back: the slot map changed twice
            why = "a Redis Cluster primary failed over (sent from 2 s before the kill until the node rejoined)"
            budget.allow(("max_attempts",), len(exposed), why, exposed)
            faults.note(
                f"Redis Cluster primary {victim} SIGKILLed; its replica served its slots {promoted_s:.1f} s later; "
                f"the node back as a replica {time.monotonic() - began:.1f} s after the kill"
            )

        async with deployed(deployment, run.log_dir) as running:
            hooks = {at(size, 0.4): faults.spawn(failover)}
            return await run_scenario("redis_cluster_failover", running, size, hooks, faults, budget, load)
    finally:
        await asyncio.to_thread(cluster.stop)


SCENARIO = Scenario(
    "redis_cluster_failover",
    run,
    "the stack on a Redis Cluster; a primary SIGKILLed, its replica takes over",
    heavy=True,
    short_timeout_s=600,
)
