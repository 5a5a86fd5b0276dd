"""The only broker (a private secured one) stopped (SIGTERM) and started again 3 s later under load, with
the shadow-comparator (a shadow experiment on every request, decisions on) and the autoscaler (local
actuator, a pool that a 10/s load on one slow worker makes it grow) in the stack beside cost-accounting.

Their effects must stay exactly once through the outage: each (experiment, request) pair compared once
and counted once; each scale decision applied once (the decisions chain, the pool under its maximum,
back to its minimum once idle); every result billed once. Errors allowed: as in broker_restart, one of
its outage codes for each request sent from 2 s before the stop until the broker answers again."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import replace

from llmbus.contract import topics as t
from llmbus_tools.harness.reliability.deployment import TENANTS
from llmbus_tools.harness.reliability.effects import Comparing, Scaling, live_pids
from llmbus_tools.harness.reliability.infra import PrivateKafka
from llmbus_tools.harness.reliability.load import MODEL, Load
from llmbus_tools.harness.reliability.stack import Stack
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, at, deployed, rejoined, run_scenario
from tests.reliability.scenarios.broker_restart import outage_through
from tests.reliability.scenarios.sigkill_autoscaler import MAX_REPLICAS, SLOW, autoscaler_env
from tests.reliability.scenarios.sigkill_comparator import CANDIDATE, EXPERIMENT, shadow_experiment


async def run(run: Run) -> Outcome:
    kafka = PrivateKafka(run.log_dir / "kafka", tenants=TENANTS)
    await asyncio.to_thread(kafka.start)
    cache = run.log_dir / "autoscaler-cache"
    prefix = f"{MODEL}-as"
    try:
        faults = Faults()
        deployment = run.deployment(kafka.secured)
        size = replace(run.size, rate_per_s=min(run.size.rate_per_s, 10.0))

        def beside(stack: Stack) -> None:
            stack.comparator()
            stack.autoscaler(autoscaler_env(deployment, run.log_dir))

        env = {
            "w1": SLOW,
            "w-cand": {"LLMBUS_WORKER_MODEL": CANDIDATE},
            "scheduler": {"LLMBUS_SCHEDULER_POOL_STATS_INTERVAL_S": "1"},  # the pool's compressed policy
        }
        budget = ErrorBudget()
        async with deployed(deployment, run.log_dir, ["w1", "w-cand"], beside, True, env, shadow_experiment) as running:
            for group in (deployment.topics.group(t.COMPARATOR), deployment.topics.group(t.AUTOSCALER)):
                await rejoined(deployment, group, set())
            comparing = await Comparing(deployment.operator, EXPERIMENT).start()
            scaling = Scaling(deployment.operator, MODEL, cache / "run", prefix, max_replicas=MAX_REPLICAS)
            await scaling.start()
            running.effects += [comparing, scaling]
            load = Load(deployment, size.requests, min(size.rate_per_s, size.requests / 20))

            async def outage() -> None:
                await outage_through(kafka, run, faults, load, budget)

            try:
                hooks = {at(size, 0.4): faults.spawn(outage)}
                return await run_scenario(
                    "comparator_autoscaler_broker_restart", running, size, hooks, faults, budget, load
                )
            finally:
                await comparing.stop()
                await scaling.stop()
    finally:
        for pid in live_pids(cache / "run", prefix).values():  # workers the autoscaler left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(kafka.stop)


SCENARIO = Scenario(
    "comparator_autoscaler_broker_restart",
    run,
    "the only broker restarted with the comparator (decisions on) and the autoscaler in the stack",
    heavy=True,
    own_broker=True,
    short_timeout_s=900,
)
