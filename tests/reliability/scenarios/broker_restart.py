"""The only broker (a private secured one) stopped (SIGTERM) mid-load and started again 3 s later; clients
keep sending throughout, so requests are sent while it is down.

Errors allowed, fixed before the run, for the requests sent from 2 s before the stop until the broker
answers again (the ones in flight or sent meanwhile), at most one each: no worker heartbeat reaches the
scheduler meanwhile, so it may find nobody serving the model (`model_unavailable`) or no capacity
(`over_capacity`), a queue past its bounds (`queue_full`, `deadline_exceeded`) or attempts spent on
workers it lost (`worker_lost`, `max_attempts`). No other code, and none for any other request."""

from __future__ import annotations

import asyncio
import time

from llmbus_tools.harness.reliability.deployment import TENANTS
from llmbus_tools.harness.reliability.infra import PrivateKafka
from llmbus_tools.harness.reliability.load import Load
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, at, deployed, run_scenario

OUTAGE_ERRORS = ("model_unavailable", "deadline_exceeded", "over_capacity", "max_attempts", "worker_lost", "queue_full")
DOWN_S = 3  # between the stop and the start; the broker is down for its start as well (a JVM: 10 s or more)
IN_FLIGHT_S = 2.0  # requests sent this long before the stop may still be on their way through it


async def outage_through(kafka: PrivateKafka, run: Run, faults: Faults, load: Load, budget: ErrorBudget) -> None:
    """Stop the broker, start it again; the requests sent meanwhile (and just before) are allowed an error."""
    stopping = time.monotonic()
    before = len(load.sent_ids)
    await asyncio.to_thread(kafka.stop)
    await asyncio.sleep(DOWN_S)
    await asyncio.to_thread(kafka.start)
    ready = time.monotonic()
    during = load.sent_ids[before:]
    in_flight = load.sent_ids[max(0, before - int(load.rate_per_s * IN_FLIGHT_S)) : before]
    exposed = [*in_flight, *during]
    budget.allow(
        OUTAGE_ERRORS,
        len(exposed),
        f"the only broker was down {ready - stopping:.1f} s: no heartbeat reached the scheduler",
        exposed,
    )
    faults.note(
        f"broker stopped (SIGTERM), started {DOWN_S} s later, ready {ready - stopping:.1f} s after the stop began;"
        f" clients sent {len(during)} requests meanwhile ({len(in_flight)} more just before)"
    )
    if not during:
        faults.problems.append("no request was sent while the broker was down: the scenario tested nothing")


async def run(run: Run) -> Outcome:
    kafka = PrivateKafka(run.log_dir / "kafka", tenants=TENANTS)
    await asyncio.to_thread(kafka.start)
    try:
        faults = Faults()
        deployment = run.deployment(kafka.secured)
        size = run.size
        budget = ErrorBudget()  # filled in by the outage, with the requests it met
        async with deployed(deployment, run.log_dir, keep_namespace=True) as running:
            load = Load(deployment, size.requests, min(size.rate_per_s, size.requests / 20))  # outlasts the outage

            async def outage() -> None:
                await outage_through(kafka, run, faults, load, budget)

            hooks = {at(size, 0.3): faults.spawn(outage)}
            return await run_scenario("broker_restart", running, size, hooks, faults, budget, load)
    finally:
        await asyncio.to_thread(kafka.stop)


SCENARIO = Scenario(
    "broker_restart",
    run,
    "the only broker stopped (SIGTERM) and started again 3 s later",
    short_timeout_s=600,
    own_broker=True,
)
