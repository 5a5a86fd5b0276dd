"""Two private Redis: the router's own (limits, cache) stopped for 4 s, later the one every service shares
(final markers and fences, placement claims, cost-accounting's state) stopped for 4 s; each started again
from its append-only file (SHUTDOWN flushes it: nothing lost).

Errors allowed, fixed before the run, for the requests sent from 2 s before an outage to its end, at
most one each: `max_attempts`, when a worker could not claim its result while the shared Redis was
down and handed the request back attempt after attempt. A placement, a claim or a refusal that meets
the outage is retried (llmbus.state.errors), the router's limits and cache fail open: nothing else."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from llmbus_tools.harness.reliability.infra import PrivateRedis
from llmbus_tools.harness.reliability.load import Load
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, at, deployed, run_scenario

OUTAGE_S = 4
IN_FLIGHT_S = 2.0
LOAD_S = 20  # the load is spread over at least this long: requests flow before, during and after a fault


def exposed_to(load: Load, before: int) -> list[str]:
    """The requests sent from IN_FLIGHT_S before position `before` to now."""
    return load.sent_ids[max(0, before - int(load.rate_per_s * IN_FLIGHT_S)) :]


async def run(run: Run) -> Outcome:
    deployment = run.deployment()
    shared_redis = deployment.redis
    assert shared_redis is not None
    router_redis = await asyncio.to_thread(run.redis, deployment, "redis-router")
    faults = Faults()
    budget = ErrorBudget()
    size = run.size
    load = Load(deployment, size.requests, min(size.rate_per_s, size.requests / LOAD_S))  # runs through the fault

    def outage(instance: PrivateRedis, who: str, counts: bool) -> Callable[[], Awaitable[None]]:
        async def action() -> None:
            before = len(load.sent_ids)
            began = time.monotonic()
            await asyncio.to_thread(instance.stop)
            await asyncio.sleep(OUTAGE_S)
            await asyncio.to_thread(instance.start)
            exposed = exposed_to(load, before)
            if counts:
                budget.allow(("max_attempts",), len(exposed), f"the Redis of {who} was down", exposed)
            faults.note(f"Redis of the {who} stopped, back {time.monotonic() - began:.1f} s later (append-only file)")

        return action

    # The router logs in to its state Redis as its own user too (LLMBUS_REDIS_USERNAME, BusSettings.redis_url_of).
    router_env = {"LLMBUS_ROUTER_STATE_REDIS_URL": router_redis.url}
    async with deployed(deployment, run.log_dir, env={"router": router_env}) as running:
        hooks = {
            at(size, 0.25): faults.spawn(outage(router_redis, "router", False)),
            at(size, 0.6): faults.spawn(outage(shared_redis, "final markers (every service)", True)),
        }
        return await run_scenario("redis_restart", running, size, hooks, faults, budget, load)


SCENARIO = Scenario("redis_restart", run, "the router's Redis stopped 4 s, later the shared Redis 4 s")
