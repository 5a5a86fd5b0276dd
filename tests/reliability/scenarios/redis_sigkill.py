"""The Redis every service shares (private: final markers and fences, placement claims, the router's
limits and cache, cost-accounting's state) SIGKILLed under load and started again 1 s later from its
append-only file, fsynced every second as deployed: up to the last second of acknowledged writes is
gone (docs/delivery.md, "What Redis data loss costs").

What that second can cost, and what must hold anyway: no request lost or answered twice (a lost `done`
marker matters only to a record delivered again, and none is: no consumer restarts); cost-accounting
finds its own tick count gone back and applies llm.costs again, so the billing conservation check
(every result billed once, Redis's totals equal to llm.costs) passes after it.

Errors allowed, fixed before the run, for the requests sent from 2 s before the kill until Redis
answers again, at most one each: `max_attempts` (a worker that could not claim its result handed the
request back attempt after attempt). Nothing else."""

from __future__ import annotations

import asyncio
import time

from llmbus_tools.harness.reliability.load import Load
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, at, deployed, run_scenario
from tests.reliability.scenarios.redis_restart import LOAD_S, exposed_to

LOST_WRITES = "Redis lost writes made after tick"  # cost-accounting's log line when it makes the loss good


async def run(run: Run) -> Outcome:
    deployment = run.deployment()
    redis = deployment.redis
    assert redis is not None
    faults = Faults()
    budget = ErrorBudget()
    size = run.size
    load = Load(deployment, size.requests, min(size.rate_per_s, size.requests / LOAD_S))  # runs through the fault

    async def crash() -> None:
        before = len(load.sent_ids)
        client = await redis.client()
        try:
            keys_before = await client.dbsize()
        finally:
            await client.aclose()
        began = time.monotonic()
        await asyncio.to_thread(redis.sigkill)
        await asyncio.sleep(1)
        await asyncio.to_thread(redis.start)
        client = await redis.client()
        try:
            keys_after = await client.dbsize()
        finally:
            await client.aclose()
        exposed = exposed_to(load, before)
        budget.allow(("max_attempts",), len(exposed), "the shared Redis was SIGKILLed and restarted", exposed)
        faults.note(
            f"Redis SIGKILLed with {keys_before} keys, answering again {time.monotonic() - began:.1f} s later "
            f"with {keys_after} from its append-only file (everysec)"
        )

    async with deployed(deployment, run.log_dir) as running:
        hooks = {at(size, 0.4): faults.spawn(crash)}
        outcome = await run_scenario("redis_sigkill", running, size, hooks, faults, budget, load)
        cost_log = running.stack.procs["cost"].log_tail(100_000)
        made_good = [line for line in cost_log.splitlines() if LOST_WRITES in line]
        outcome.notes.append(
            f"cost-accounting found lost writes {len(made_good)} time(s): "
            + ("; ".join(line.split(": ", 1)[-1][:200] for line in made_good) or "none lost")
        )
        return outcome


SCENARIO = Scenario("redis_sigkill", run, "the shared Redis SIGKILLed (AOF everysec), started again 1 s later")
