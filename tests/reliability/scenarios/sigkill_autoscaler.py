"""One slow static worker and a 10/s load: the autoscaler (local actuator, its workers as the worker
principal) adds workers on the queue wait and is SIGKILLed twice meanwhile (`kill_twice`); its workers
outlive it. Each decision is applied once (`llmbus_tools.harness.reliability.effects.Scaling`): the
decisions chain, the pool stays under its maximum, and once idle it ends at its minimum with no worker
left behind. Nothing a client needs is down."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from dataclasses import replace
from pathlib import Path

import yaml

from llmbus.contract import topics as t
from llmbus_tools.harness.reliability.deployment import Deployment
from llmbus_tools.harness.reliability.effects import Scaling, live_pids
from llmbus_tools.harness.reliability.load import MODEL
from llmbus_tools.harness.reliability.stack import Stack
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, at, deployed, kill_twice, rejoined, run_scenario

SLOW = {"LLMBUS_WORKER_SIM_SPEEDUP": "1", "LLMBUS_WORKER_SIM_MAX_NUM_SEQS": "1"}  # one request at a time
MAX_REPLICAS = 3


def autoscaled_pool(path: Path, max_replicas: int) -> Path:
    """The scenario's pool file (a deployment's own configuration): MODEL scales on a 100 ms queue wait
    within a second or two, on slow one-slot sim workers that a 10/s load outruns."""
    params = {"target_queue_wait_ms": 100, "up_after_s": 1, "idle_after_s": 3, "cooldown_s": 2, "ready_timeout_s": 30}
    pool = {
        "min_replicas": 0,
        "max_replicas": max_replicas,
        "policy": {"type": "threshold", "params": params},
        "local": {"engine": "sim", "stop_grace_s": 10, "env": SLOW},
    }
    path.write_text(yaml.safe_dump({"pools": {MODEL: pool}}))
    return path


def autoscaler_env(deployment: Deployment, log_dir: Path) -> dict[str, str]:
    return {
        "LLMBUS_CACHE": str(log_dir / "autoscaler-cache"),  # the local actuator's run dir: its workers' pid files
        "LLMBUS_AUTOSCALER_POOLS": str(autoscaled_pool(log_dir / "pools.yaml", MAX_REPLICAS)),
        "LLMBUS_AUTOSCALER_ACTUATOR": "local",
        # The workers it starts connect as the worker principal, as `llmbus up` hands it.
        "LLMBUS_AUTOSCALER_WORKER_ENV": json.dumps(deployment.env(t.WORKER)),
    }


async def run(run: Run) -> Outcome:
    faults = Faults()
    size = replace(run.size, rate_per_s=min(run.size.rate_per_s, 10.0))  # long enough to scale and to kill twice
    deployment = run.deployment()
    cache = run.log_dir / "autoscaler-cache"
    prefix = f"{MODEL}-as"

    def with_autoscaler(stack: Stack) -> None:
        stack.autoscaler(autoscaler_env(deployment, run.log_dir))

    # The pool's statistics every second (5 s as shipped), so the compressed policy above sees its queue.
    env = {"w1": SLOW, "scheduler": {"LLMBUS_SCHEDULER_POOL_STATS_INTERVAL_S": "1"}}
    try:
        async with deployed(deployment, run.log_dir, ["w1"], with_autoscaler, env=env) as running:
            group = deployment.topics.group(t.AUTOSCALER)
            await rejoined(deployment, group, set())
            scaling = Scaling(deployment.operator, MODEL, cache / "run", prefix, max_replicas=MAX_REPLICAS)
            await scaling.start()
            running.effects.append(scaling)
            try:
                hooks = {at(size, 0.3): faults.spawn(kill_twice(running.stack, faults, "autoscaler", group))}
                return await run_scenario("sigkill_autoscaler", running, size, hooks, faults, ErrorBudget())
            finally:
                await scaling.stop()
    finally:
        for pid in live_pids(cache / "run", prefix).values():  # workers the autoscaler left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


SCENARIO = Scenario("sigkill_autoscaler", run, "the autoscaler (local actuator) SIGKILLed twice while it scales")
