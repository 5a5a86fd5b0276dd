"""A worker SIGSTOPped past the scheduler's heartbeat timeout (5 s, shipped) for 9 s, then SIGCONTed: it
wakes up as a zombie whose work was placed again. Its late attempts are fenced off: nothing is down."""

from __future__ import annotations

import asyncio
import signal

from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, at, deployed, run_scenario


async def run(run: Run) -> Outcome:
    faults = Faults()
    async with deployed(run.deployment(), run.log_dir) as running:
        stack = running.stack

        async def freeze() -> None:
            stack.signal("w1", signal.SIGSTOP)
            await asyncio.sleep(9)
            stack.signal("w1", signal.SIGCONT)
            faults.note("w1 SIGSTOPped for 9 s (heartbeat timeout 5 s), then SIGCONTed")

        hooks = {at(run.size, 0.4): faults.spawn(freeze)}
        return await run_scenario("zombie_worker", running, run.size, hooks, faults, ErrorBudget())


SCENARIO = Scenario("zombie_worker", run, "a worker SIGSTOPped 9 s (past the 5 s heartbeat timeout), then SIGCONTed")
