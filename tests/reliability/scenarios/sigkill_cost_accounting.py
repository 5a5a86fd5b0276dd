"""cost-accounting SIGKILLed mid-load, restarted 1 s later; once the new process holds its group,
SIGKILLed and restarted again. As shipped: 60 s GPU-ledger intervals, 30 s of grace, 10 s group
sessions. Every result billed exactly once and the money conserved in its Redis totals."""

from __future__ import annotations

from llmbus.contract import topics as t
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, at, deployed, kill_twice, run_scenario


async def run(run: Run) -> Outcome:
    faults = Faults()
    async with deployed(run.deployment(), run.log_dir) as running:
        group = running.deployment.topics.group(t.COST, "results")
        hooks = {at(run.size, 0.4): faults.spawn(kill_twice(running.stack, faults, "cost", group))}
        return await run_scenario("sigkill_cost_accounting", running, run.size, hooks, faults, ErrorBudget())


SCENARIO = Scenario("sigkill_cost_accounting", run, "cost-accounting SIGKILLed twice, each time restarted 1 s later")
