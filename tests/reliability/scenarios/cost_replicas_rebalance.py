"""Two cost-accounting replicas share llm.results (one group) and the workers' GPU time (a lease per worker,
flows/ledger.py). Mid-load the second is SIGKILLed: its partitions move to the first once its session
times out (10 s, shipped); it is started again 1 s later and takes partitions back once it rejoins (a
second rebalance), and the same again (`kill_twice`). Every result billed once by one of them, every
GPU-millisecond of a worker priced by one, and the money conserved in Redis's totals."""

from __future__ import annotations

from llmbus.contract import topics as t
from llmbus_tools.harness.reliability.stack import Stack
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, at, deployed, kill_twice, run_scenario


def second_replica(stack: Stack) -> None:
    stack.cost("cost-2")


async def run(run: Run) -> Outcome:
    faults = Faults()
    deployment = run.deployment()
    async with deployed(deployment, run.log_dir, build=second_replica) as running:
        group = deployment.topics.group(t.COST, "results")
        hooks = {at(run.size, 0.35): faults.spawn(kill_twice(running.stack, faults, "cost-2", group))}
        return await run_scenario("cost_replicas_rebalance", running, run.size, hooks, faults, ErrorBudget())


SCENARIO = Scenario("cost_replicas_rebalance", run, "two cost-accounting replicas; one SIGKILLed twice (rebalances)")
