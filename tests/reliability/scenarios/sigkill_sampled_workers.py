"""Three sim workers stream sampled answers (temperature > 0, no seed: a restart could never line up with
what a client was sent); one after another is SIGKILLed mid-stream and restarted 2 s later (two kills in the
short size, four in the long). Every cut answer is continued by another worker from exactly what its client
was sent (docs/delivery.md, "Continuation across legs").

Judged by the delivery audit (no error allowed), by what every client was shown
(`llmbus_tools.harness.reliability.streams.Streams`: one stream, no error, no restart, each leg's chunks
exactly its tokens) and by billing (each leg billed once, the answer's cost their sum)."""

from __future__ import annotations

from llmbus_tools.harness.reliability.handover import SAMPLED_SIM_ENV, sampled
from llmbus_tools.harness.reliability.load import MODEL, Load
from llmbus_tools.harness.reliability.streams import Streams
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, at, deployed, kill_then_restart, run_scenario

WORKERS = ["w1", "w2", "w3"]


async def run(run: Run) -> Outcome:
    faults = Faults()
    size = run.size
    victims = ["w1", "w2", "w3", "w1"] if size.requests > 1000 else ["w1", "w2"]
    env = {worker: SAMPLED_SIM_ENV for worker in WORKERS}
    async with deployed(run.deployment(), run.log_dir, WORKERS, env=env) as running:
        stack = running.stack
        # From half-way on: the first answers take a second to reach their workers (router, scheduler,
        # placement on a loaded machine) and stream for one to three more.
        hooks = {
            at(size, 0.5 + 0.4 * n / len(victims)): faults.spawn(kill_then_restart(stack, faults, victim))
            for n, victim in enumerate(victims)
        }
        deployment = running.deployment
        load = Load(deployment, size.requests, size.rate_per_s, make=sampled(deployment, MODEL, (60, 140)))
        running.effects.append(Streams(deployment.topics))
        return await run_scenario("sigkill_sampled_workers", running, size, hooks, faults, ErrorBudget(), load)


SCENARIO = Scenario(
    "sigkill_sampled_workers", run, "SIGKILL sim workers mid-stream, one after another: cut answers continued"
)
