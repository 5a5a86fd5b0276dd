"""Fault scenarios for the services beside the request path: cost-accounting, the shadow-comparator,
the gateway and the autoscaler, each in the stack under load and SIGKILLed mid-run, judged by their exactly-once
effects (`llmbus_tools.harness.reliability.effects`) besides the delivery audit. Sizes and helpers are the other
scenarios' (`tests.reliability.scenarios`); docs/reliability.md says how each is judged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import yaml

from llmbus.cli.experiments import publish_record
from llmbus.contract import topics as t
from llmbus.contract.messages import ModelSpec
from llmbus.domain.lifecycle import create
from llmbus.settings import BusSettings
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.reliability.effects import Billing, Comparing, Scaling, group_members, live_pids
from llmbus_tools.harness.reliability.gateway import api_keys, wait_ready
from llmbus_tools.harness.reliability.stack import (
    MODEL,
    Answers,
    Outcome,
    Stack,
    dispose,
    finish,
    prepare,
    start_and_wait,
)
from llmbus_tools.harness.service_procs import ServiceProc, fresh_settings
from tests.reliability.gateway import HttpLoad
from tests.reliability.scenarios import NO_ERRORS, WORKERS, Faults, Size, at, run_scenario, running_stack

CANDIDATE = "sim-cand"  # the shadow experiment's candidate model (sigkill_comparator)


async def rejoined(settings: BusSettings, group: str, before: set[str]) -> set[str]:
    """Until a member not in `before` holds `group` (a restarted process consumes again)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    while not (members := await group_members(settings, group)) or members <= before:
        if loop.time() > deadline:
            raise TimeoutError(f"nobody new joined {group} within 120 s")
        await asyncio.sleep(0.2)
    return members


def kill_twice(stack: Stack, faults: Faults, name: str, group: str) -> Callable[[], Awaitable[None]]:
    """SIGKILL `name`, restart it 1 s later; once the new process holds its group (a SIGKILLed
    member keeps its partitions until its session times out), the same again: the second kill
    meets a process that is taking over the first one's uncommitted work."""

    async def action() -> None:
        for n in (1, 2):
            before = await group_members(stack.settings, group)
            stack.kill(name)
            faults.note(f"SIGKILL {name} ({n})")
            await asyncio.sleep(1)
            stack.restart(name)
            await rejoined(stack.settings, group, before)
            faults.note(f"{name} restarted and rejoined its group")
            await asyncio.sleep(0.5)

    return action


@contextlib.asynccontextmanager
async def billed_stack(settings: BusSettings, log_dir: Path) -> AsyncIterator[tuple[Stack, Billing]]:
    """`running_stack` plus cost-accounting, once it consumes llm.results, and a tail of llm.costs."""
    async with running_stack(settings, log_dir) as stack:
        stack.cost()
        await rejoined(settings, t.Topics(settings.topic_prefix).group(t.COST, "results"), set())
        billing = await Billing(settings).start()
        try:
            yield stack, billing
        finally:
            await billing.stop()


async def sigkill_cost_accounting(size: Size, log_dir: Path) -> Outcome:
    """cost-accounting in the stack under load, SIGKILLed twice (`kill_twice`): every result billed
    exactly once on llm.costs, and counted once in its Redis totals."""
    settings = fresh_settings()
    faults = Faults()
    group = t.Topics(settings.topic_prefix).group(t.COST, "results")
    try:
        async with billed_stack(settings, log_dir) as (stack, billing):
            hooks = {at(size, 0.4): faults.spawn(kill_twice(stack, faults, "cost", group))}
            return await run_scenario(
                "sigkill_cost_accounting", settings, stack, size, hooks, faults, NO_ERRORS, effects=[billing]
            )
    finally:
        await dispose(settings)


async def sigkill_comparator(size: Size, log_dir: Path) -> Outcome:
    """A shadow experiment on every request (candidate `sim-cand` on a worker of its own) with the
    shadow-comparator in the stack, SIGKILLed twice (`kill_twice`): each (experiment, request)
    pair compared once on llm.comparisons and counted once in the experiment's pair aggregate."""
    settings = fresh_settings()
    faults = Faults()
    group = t.Topics(settings.topic_prefix).group(t.COMPARATOR)
    experiment_id = "rel-shadow"
    try:
        await prepare(settings)
        # Before router and comparator start: both read llm.experiments from the start, so the
        # first request is mirrored and its primary held for the join.
        await publish_record(settings, t.EXPERIMENTS, experiment_id, create(experiment_id, MODEL, CANDIDATE))
        await publish_record(settings, t.MODELS, CANDIDATE, ModelSpec(name=CANDIDATE, max_output_tokens=256))
        stack = Stack(settings, log_dir)
        stack.router()
        stack.scheduler()
        for worker_id in WORKERS:
            stack.worker(worker_id)
        stack.shadow_worker("w-cand", CANDIDATE)
        stack.comparator()
        supervisor = asyncio.create_task(stack.supervise())
        try:
            await start_and_wait(stack, [*WORKERS, "w-cand"])
            await rejoined(settings, group, set())
            comparing = await Comparing(settings, experiment_id, every_request=True).start()
            try:
                hooks = {at(size, 0.4): faults.spawn(kill_twice(stack, faults, "comparator", group))}
                return await run_scenario(
                    "sigkill_comparator", settings, stack, size, hooks, faults, NO_ERRORS, effects=[comparing]
                )
            finally:
                await comparing.stop()
        finally:
            supervisor.cancel()
            stack.stop_all()
    finally:
        await dispose(settings)


async def sigkill_gateway(size: Size, log_dir: Path) -> Outcome:
    """HTTP clients stream through the gateway; it is SIGKILLed mid-run and restarted 1 s later
    (the same instance id: the same reply topic) while they keep sending. Every request a client
    saw accepted gets exactly one result; every accepted stream ends with [DONE], an error event
    or a broken connection, never silently (`tests.reliability.gateway`)."""
    settings = fresh_settings()
    faults = Faults()
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    try:
        async with running_stack(settings, log_dir) as stack:
            keys = await api_keys(settings)
            gateway_env = {"LLMBUS_GATEWAY_PORT": str(port), "LLMBUS_GATEWAY_INSTANCE_ID": "gw-rel"}
            stack.procs["gateway"] = ServiceProc(
                "llmbus_services.gateway", settings, env=gateway_env, log_dir=log_dir, name="gateway"
            ).start()
            await wait_ready(base_url)

            async def kill_restart() -> None:
                stack.kill("gateway")
                faults.note("SIGKILL gateway")
                await asyncio.sleep(1)
                stack.restart("gateway")
                await wait_ready(base_url)
                load.restarted = True
                faults.note("gateway restarted and ready")

            # Slow enough that the load usually outlasts the restart (~6 s on a busy machine, 11 s
            # seen under make test); if not, it goes on until the restarted gateway has accepted one.
            load = HttpLoad(base_url, keys, size.requests, min(size.rate_per_s, size.requests / 16))
            started = time.monotonic()
            faults.started = started
            answers = await Answers(settings).start()
            try:
                await load.run(
                    {at(size, 0.3): faults.spawn(kill_restart)}, until=lambda: load.accepted_after_restart > 0
                )
                await faults.done()
                notes = [*faults.notes, load.summary()]
                outcome = await finish(
                    "sigkill_gateway",
                    settings,
                    stack,
                    answers,
                    load.accepted,
                    started,
                    answer_timeout_s=size.answer_timeout_s,
                    error_bound=NO_ERRORS,
                    notes=notes,
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
    finally:
        await dispose(settings)


def autoscaled_pool(path: Path, max_replicas: int) -> Path:
    """The scenario's pool file: MODEL scales on a 100 ms queue wait within a second or two (timings
    compressed), on slow one-slot sim workers that a 10/s load outruns."""
    slow = {"LLMBUS_WORKER_SIM_SPEEDUP": "1", "LLMBUS_WORKER_SIM_MAX_NUM_SEQS": "1"}
    params = {"target_queue_wait_ms": 100, "up_after_s": 1, "idle_after_s": 3, "cooldown_s": 2, "ready_timeout_s": 30}
    pool = {
        "min_replicas": 0,
        "max_replicas": max_replicas,
        "policy": {"type": "threshold", "params": params},
        "local": {"engine": "sim", "stop_grace_s": 10, "env": slow | {"LLMBUS_WORKER_HEARTBEAT_INTERVAL_S": "0.5"}},
    }
    path.write_text(yaml.safe_dump({"pools": {MODEL: pool}}))
    return path


async def sigkill_autoscaler(size: Size, log_dir: Path) -> Outcome:
    """One slow static worker and a 10/s load: the autoscaler (local actuator) adds workers on the
    queue wait and is SIGKILLed twice meanwhile (`kill_twice`); its workers outlive it. Each decision
    is applied once (`llmbus_tools.harness.reliability.effects.Scaling`): the decisions chain, the pool stays under
    its maximum, and once idle it ends at its minimum with no worker left behind."""
    settings = fresh_settings()
    faults = Faults()
    group = t.Topics(settings.topic_prefix).group(t.AUTOSCALER)
    size = replace(size, rate_per_s=min(size.rate_per_s, 10.0))  # long enough to scale and to kill twice
    cache = log_dir / "autoscaler-cache"  # the local actuator's run dir: its workers' pid files
    prefix = f"{MODEL}-as"
    try:
        await prepare(settings)
        stack = Stack(settings, log_dir)
        stack.router()
        stack.scheduler(env={"LLMBUS_SCHEDULER_POOL_STATS_INTERVAL_S": "1"})
        stack.worker("w1", env={"LLMBUS_WORKER_SIM_SPEEDUP": "1", "LLMBUS_WORKER_SIM_MAX_NUM_SEQS": "1"})
        stack.autoscaler(
            {
                "LLMBUS_CACHE": str(cache),
                "LLMBUS_AUTOSCALER_POOLS": str(autoscaled_pool(log_dir / "pools.yaml", max_replicas=3)),
                "LLMBUS_AUTOSCALER_ACTUATOR": "local",
                "LLMBUS_SESSION_TIMEOUT_MS": "6000",  # a SIGKILLed member's partitions: the broker's minimum
            }
        )
        supervisor = asyncio.create_task(stack.supervise())
        try:
            await start_and_wait(stack, ["w1"])
            await rejoined(settings, group, set())
            scaling = await Scaling(settings, MODEL, cache / "run", prefix, max_replicas=3).start()
            try:
                hooks = {at(size, 0.3): faults.spawn(kill_twice(stack, faults, "autoscaler", group))}
                return await run_scenario(
                    "sigkill_autoscaler", settings, stack, size, hooks, faults, NO_ERRORS, effects=[scaling]
                )
            finally:
                await scaling.stop()
        finally:
            supervisor.cancel()
            stack.stop_all()
            for pid in live_pids(cache / "run", prefix).values():  # workers the autoscaler left running
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    finally:
        await dispose(settings)


SERVICE_SCENARIOS: dict[str, Callable[[Size, Path], Awaitable[Outcome]]] = {
    "sigkill_cost_accounting": sigkill_cost_accounting,
    "sigkill_comparator": sigkill_comparator,
    "sigkill_gateway": sigkill_gateway,
    "sigkill_autoscaler": sigkill_autoscaler,
}
