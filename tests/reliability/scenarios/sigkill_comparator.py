"""A shadow experiment on every request (the candidate `sim-cand` on a worker of its own) with the
shadow-comparator in the stack, decisions on as shipped (it may promote or roll back mid-run), SIGKILLed
twice (`kill_twice`): each (experiment, request) pair compared once on llm.comparisons and counted once
in the experiment's pair aggregates (what its decisions read). Nothing a client needs is down."""

from __future__ import annotations

from llmbus.cli.experiments import publish_record
from llmbus.contract import topics as t
from llmbus.contract.messages import ModelSpec
from llmbus.domain.lifecycle import create
from llmbus_tools.harness.reliability.deployment import Deployment
from llmbus_tools.harness.reliability.effects import Comparing
from llmbus_tools.harness.reliability.load import MODEL
from llmbus_tools.harness.reliability.stack import Stack
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import WORKERS, Faults, Run, Scenario, at, deployed, kill_twice, rejoined, run_scenario

CANDIDATE = "sim-cand"  # the shadow experiment's candidate model
EXPERIMENT = "rel-shadow"


async def shadow_experiment(deployment: Deployment) -> None:
    """Published by the operator before router and comparator start: both read llm.experiments from its
    start, so the first request is mirrored and its primary held for the join."""
    operator = deployment.operator
    await publish_record(operator, t.EXPERIMENTS, EXPERIMENT, create(EXPERIMENT, MODEL, CANDIDATE))
    await publish_record(operator, t.MODELS, CANDIDATE, ModelSpec(name=CANDIDATE, max_output_tokens=256))


def with_comparator(stack: Stack) -> None:
    stack.comparator()


async def run(run: Run) -> Outcome:
    faults = Faults()
    deployment = run.deployment()
    workers = [*WORKERS, "w-cand"]
    env = {"w-cand": {"LLMBUS_WORKER_MODEL": CANDIDATE}}
    async with deployed(
        deployment, run.log_dir, workers, with_comparator, env=env, before_start=shadow_experiment
    ) as running:
        group = deployment.topics.group(t.COMPARATOR)
        await rejoined(deployment, group, set())
        comparing = await Comparing(deployment.operator, EXPERIMENT).start()
        running.effects.append(comparing)
        try:
            hooks = {at(run.size, 0.4): faults.spawn(kill_twice(running.stack, faults, "comparator", group))}
            return await run_scenario("sigkill_comparator", running, run.size, hooks, faults, ErrorBudget())
        finally:
            await comparing.stop()


SCENARIO = Scenario("sigkill_comparator", run, "the shadow-comparator (decisions on) SIGKILLed twice")
