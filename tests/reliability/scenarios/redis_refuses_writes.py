"""The Redis every service shares (private) refuses writes for a while under load, twice: out of memory
(maxmemory reached with noeviction: OOM) for 5 s, later read-only (made a replica of a primary that is
not there, as a primary demoted by a failover is: READONLY) for 5 s. Reads and the data stay.

Both are transient (llmbus.state.errors): a batch that meets one is retried in place, never
dead-lettered (cost-accounting's results above all: nothing unbilled, the conservation check passes),
a placement is tried again, a claim the worker cannot take hands its request back. Errors allowed,
fixed before the run, for the requests sent from 2 s before a refusal to its end, at most one each:
`max_attempts` (a request handed back attempt after attempt). No dead letter of cost-accounting."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from llmbus.contract import topics as t
from llmbus_tools.harness.reliability.infra import refuse_writes, take_writes
from llmbus_tools.harness.reliability.load import Load
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, at, deployed, run_scenario
from tests.reliability.scenarios.redis_restart import LOAD_S, exposed_to

REFUSE_S = 5


async def run(run: Run) -> Outcome:
    deployment = run.deployment()
    redis = deployment.redis
    assert redis is not None
    faults = Faults()
    budget = ErrorBudget()
    size = run.size
    load = Load(deployment, size.requests, min(size.rate_per_s, size.requests / LOAD_S))  # runs through the fault

    def refusing(how: str) -> Callable[[], Awaitable[None]]:
        async def action() -> None:
            before = len(load.sent_ids)
            client = await redis.client()
            try:
                await refuse_writes(client, how)
                await asyncio.sleep(REFUSE_S)
                await take_writes(client)
            finally:
                await client.aclose()
            exposed = exposed_to(load, before)
            budget.allow(("max_attempts",), len(exposed), f"the shared Redis refused writes ({how})", exposed)
            faults.note(f"the shared Redis refused writes ({how}) for {REFUSE_S} s")

        return action

    async with deployed(deployment, run.log_dir) as running:
        hooks = {at(size, 0.25): faults.spawn(refusing("oom")), at(size, 0.6): faults.spawn(refusing("readonly"))}
        outcome = await run_scenario("redis_refuses_writes", running, size, hooks, faults, budget, load)
        letters = {by: n for by, n in outcome.report.dead_letters_by.items() if by.startswith(f"{t.COST}/")}
        if letters:
            outcome.effect_problems.append(f"cost-accounting dead-lettered records: {letters}")
        return outcome


SCENARIO = Scenario("redis_refuses_writes", run, "the shared Redis refuses writes: OOM for 5 s, later READONLY 5 s")
