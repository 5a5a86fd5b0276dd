"""SIGKILL the router, then the scheduler, then a worker, mid-load; each restarted 2 s later.

Nothing a client needs is down for long: every request must be answered, none twice."""

from __future__ import annotations

from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, at, deployed, kill_then_restart, run_scenario


async def run(run: Run) -> Outcome:
    faults = Faults()
    size = run.size
    async with deployed(run.deployment(), run.log_dir) as running:
        stack = running.stack
        hooks = {
            at(size, 0.2): faults.spawn(kill_then_restart(stack, faults, "router")),
            at(size, 0.45): faults.spawn(kill_then_restart(stack, faults, "scheduler")),
            at(size, 0.7): faults.spawn(kill_then_restart(stack, faults, "w1")),
        }
        return await run_scenario("sigkill_each_service", running, size, hooks, faults, ErrorBudget())


SCENARIO = Scenario("sigkill_each_service", run, "SIGKILL router, then scheduler, then a worker; each back 2 s later")
