"""HTTP clients stream through the gateway (one API key per tenant); it is SIGKILLed mid-run and restarted
1 s later under the same instance id (the same reply topic) while they keep sending. Every request a client
saw accepted gets exactly one result; every accepted stream ends with [DONE], an error event or a broken
connection, never silently (tests/reliability/gateway.py). Nothing a client needs is down for long."""

from __future__ import annotations

import asyncio
import time

from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.reliability.gateway import api_keys, wait_ready
from llmbus_tools.harness.reliability.load import Answers
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome, finish
from tests.reliability.common import Faults, Run, Scenario, at, deployed
from tests.reliability.gateway import HttpLoad


async def run(run: Run) -> Outcome:
    faults = Faults()
    size = run.size
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    deployment = run.deployment()
    async with deployed(deployment, run.log_dir) as running:
        stack = running.stack
        keys = await api_keys(deployment.operator, deployment.tenants)
        stack.gateway(port, "gw-rel")
        await wait_ready(base_url)

        async def kill_restart() -> None:
            stack.kill("gateway")
            faults.note("SIGKILL gateway")
            await asyncio.sleep(1)
            stack.restart("gateway")
            await wait_ready(base_url)
            load.restarted = True
            faults.note("gateway restarted and ready")

        # Slow enough that the load usually outlasts the restart (~6 s on a busy machine, 11 s seen under
        # make test); if not, it goes on until the restarted gateway has accepted one.
        load = HttpLoad(base_url, keys, size.requests, min(size.rate_per_s, size.requests / 16), deployment.tenants)
        started = time.monotonic()
        faults.started = started
        answers = await Answers(deployment).start()
        try:
            await load.run({at(size, 0.3): faults.spawn(kill_restart)}, until=lambda: load.accepted_after_restart > 0)
            await faults.done()
            outcome = await finish(
                "sigkill_gateway",
                stack,
                answers,
                load.accepted,
                started,
                answer_timeout_s=size.answer_timeout_s,
                budget=ErrorBudget(),
                notes=[*faults.notes, load.summary()],
                effects=[running.billing],
            )
        finally:
            await answers.stop()
        if load.silent:
            outcome.effect_problems.append(f"accepted streams that ended silently: {load.silent[:5]}")
        if not load.broken and not load.refused:
            outcome.effect_problems.append("the kill touched no client: the scenario tested nothing")
        if not load.accepted_after_restart:
            outcome.effect_problems.append("the restarted gateway accepted nothing before the load ended")
        return outcome


SCENARIO = Scenario("sigkill_gateway", run, "the gateway SIGKILLed under streaming HTTP clients, back 1 s later")
