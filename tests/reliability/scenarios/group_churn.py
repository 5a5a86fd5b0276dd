"""Router and scheduler replicas added and removed (SIGTERM, drained) under load: nothing is down."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from llmbus_tools.harness.reliability.stack import Stack
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, at, deployed, run_scenario


async def run(run: Run) -> Outcome:
    faults = Faults()
    size = run.size

    def add(stack: Stack, kind: str, name: str) -> Callable[[], Awaitable[None]]:
        async def action() -> None:
            getattr(stack, kind)(name)
            faults.note(f"added {name}")

        return action

    def remove(stack: Stack, name: str) -> Callable[[], Awaitable[None]]:
        async def action() -> None:
            await asyncio.to_thread(stack.retire, name)
            faults.note(f"removed {name} (SIGTERM, exit {stack.procs[name].proc.returncode})")  # type: ignore[union-attr]

        return action

    async with deployed(run.deployment(), run.log_dir) as running:
        stack = running.stack
        hooks = {
            at(size, 0.15): faults.spawn(add(stack, "router", "router-2")),
            at(size, 0.25): faults.spawn(add(stack, "scheduler", "scheduler-2")),
            at(size, 0.45): faults.spawn(remove(stack, "router")),
            at(size, 0.55): faults.spawn(remove(stack, "scheduler")),
            at(size, 0.65): faults.spawn(add(stack, "router", "router-3")),
            at(size, 0.8): faults.spawn(remove(stack, "router-2")),
        }
        return await run_scenario("group_churn", running, size, hooks, faults, ErrorBudget())


SCENARIO = Scenario("group_churn", run, "router and scheduler replicas added and removed (SIGTERM, drained)")
