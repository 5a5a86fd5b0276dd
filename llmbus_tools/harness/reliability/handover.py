"""Scale-down under load on the real broker: the autoscaler's local actuator drains workers while they stream
sampled answers, and each answer they cannot finish is handed over mid-stream and continued elsewhere.

What the autoscaler does when its policy scales a pool down, without waiting for the policy: the same
LocalActuator (services/autoscaler/adapters/actuators/local.py) scales the pool from 2 workers to 1 and then to 0
mid-load, beside one static worker that keeps serving. Each scaled-down worker gets SIGTERM: it stops taking
dispatches, hands its answers over after the pool's handover grace, and exits. Judged like every fault scenario
(the delivery audit, error bound none) plus what every client was shown (`streams.Streams`: one stream, no
error, no restart, each leg exactly its tokens); measured: the client's wait at each handover (its next leg's
first chunk less the drained leg's last chunk, record timestamps) and each worker's SIGTERM-to-exit time.
Used by tests/reliability (the `scale_down_handover` scenario) and bench/handover_bench.py (the report).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from llmbus.audit import AuditReport
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceRequest
from llmbus.process import detached
from llmbus.security.tenancy import default_reply_topic
from llmbus_services.autoscaler.adapters.actuators.local import LocalActuator
from llmbus_services.autoscaler.core.config import LocalSpec
from llmbus_tools.harness.reliability.deployment import Deployment
from llmbus_tools.harness.reliability.load import MODEL, Answers, Load, MakeRequest
from llmbus_tools.harness.reliability.stack import Stack
from llmbus_tools.harness.reliability.streams import Streams
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome, dispose, finish
from llmbus_tools.harness.service_procs import wait_workers_ready

# Sampled answers at a third of the H100 profile's speed: a 100-token answer streams for about two seconds.
SAMPLED_SIM_ENV = {"LLMBUS_WORKER_SIM_SPEEDUP": "0.3", "LLMBUS_WORKER_SIM_SAMPLE_UNSEEDED": "true"}
STATIC_WORKER = "w-static"


def sampled(deployment: Deployment, model: str, tokens: tuple[int, int]) -> MakeRequest:
    """A sampled request (temperature 0.9, no seed: a restart could never line up) of `tokens` tokens at most,
    from one of the deployment's tenants, answered on its reply topic."""

    def make(i: int, rng: random.Random) -> InferenceRequest:
        tenant = deployment.tenants[i % len(deployment.tenants)]
        return InferenceRequest(
            tenant=tenant,
            model=model,
            prompt=f"continuation probe {i}: " + "words " * rng.randrange(4, 40),
            max_tokens=rng.randrange(*tokens),
            temperature=0.9,
            reply_topic=default_reply_topic(deployment.broker is not None, tenant),
        )

    return make


@dataclass
class HandoverRun:
    outcome: Outcome
    handover_grace_s: float
    gaps_ms: list[int] = field(default_factory=list)  # the client's wait at each handover
    drain_s: dict[str, float] = field(default_factory=dict)  # scaled-down worker -> SIGTERM to exit
    handed_over: int = 0  # answers cut on a scaled-down worker and continued elsewhere


@contextlib.contextmanager
def _run_dir(path: Path) -> Iterator[None]:
    """The local actuator's pid and log files under `path` ($LLMBUS_CACHE, read at each call)."""
    before = os.environ.get("LLMBUS_CACHE")
    os.environ["LLMBUS_CACHE"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LLMBUS_CACHE", None)
        else:
            os.environ["LLMBUS_CACHE"] = before


async def _exit_time(actuator: LocalActuator, index: int, signalled: float) -> float:
    """Seconds from SIGTERM until the pool's worker `index` has exited (its pid file gone or its pid dead)."""
    proc = actuator.process(MODEL, index)
    while detached.pid_of(proc) is not None:
        await asyncio.sleep(0.05)
    return time.monotonic() - signalled


async def scale_down_under_load(
    deployment: Deployment,
    log_dir: Path,
    requests: int,
    rate_per_s: float,
    answer_timeout_s: float,
    handover_grace_s: float = 1.0,
) -> HandoverRun:
    """2 actuator workers + 1 static one serve sampled answers; the pool is scaled to 1 at 35 % of the load and to
    0 at 70 %. The actuator's workers join as the deployment's worker principal. Returns the judged outcome and
    the measurements (the namespace is dropped)."""
    settings = deployment.base
    spec = LocalSpec(
        engine="sim",
        stop_grace_s=20,
        handover_grace_s=handover_grace_s,
        env=SAMPLED_SIM_ENV,  # the shipped defaults otherwise, as the stack's own workers
    )
    bus_env = {"LLMBUS_TOPIC_PREFIX": settings.topic_prefix, "LLMBUS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
    bus_env |= {"LLMBUS_REDIS_URL": settings.redis_url} | deployment.env(t.WORKER)
    actuator = LocalActuator({MODEL: spec}, bus_env)
    run = HandoverRun(Outcome("scale_down_handover", report=AuditReport(), seconds=0.0), handover_grace_s)
    exits: dict[str, asyncio.Task[float]] = {}
    notes: list[str] = []
    with _run_dir(log_dir / "actuator"):
        await deployment.prepare()
        stack = Stack(deployment, log_dir)
        stack.router()
        stack.scheduler()
        stack.worker(STATIC_WORKER, env=SAMPLED_SIM_ENV)
        supervisor = asyncio.create_task(stack.supervise())
        started = time.monotonic()
        try:
            await stack.workers_ready([STATIC_WORKER])
            await actuator.scale(MODEL, 2)
            pool = {actuator.process(MODEL, i).name for i in actuator.running(MODEL)}
            await wait_workers_ready(deployment.operator, pool, timeout_s=180)

            def scale_to(replicas: int) -> Callable[[int], Awaitable[None]]:
                async def hook(_: int) -> None:
                    before = set(actuator.running(MODEL))
                    signalled = time.monotonic()
                    await actuator.scale(MODEL, replicas)
                    for index in sorted(before - set(actuator.running(MODEL))):
                        name = actuator.process(MODEL, index).name
                        exits[name] = asyncio.create_task(_exit_time(actuator, index, signalled))
                        notes.append(f"t+{signalled - started:.1f}s pool scaled to {replicas}: SIGTERM {name}")

                return hook

            answers = await Answers(deployment).start()
            try:
                load = Load(deployment, requests, rate_per_s, make=sampled(deployment, MODEL, (60, 140)))
                load.hooks = {int(requests * 0.35): scale_to(1), int(requests * 0.7): scale_to(0)}
                sent = await load.run()
                drains = await asyncio.wait_for(asyncio.gather(*exits.values()), 60)
                streams = Streams(deployment.topics)
                run.outcome = await finish(
                    "scale_down_handover",
                    stack,
                    answers,
                    sent,
                    started,
                    answer_timeout_s=answer_timeout_s,
                    budget=ErrorBudget(),
                    notes=notes,
                    effects=[streams],
                )
            finally:
                await answers.stop()
            # Counted by the worker the cut leg ran on, not by the cause its result records: the drained worker's
            # handed_back outcomes and its STOPPED heartbeat (sent after them) come to the scheduler on two topics,
            # and when it reads STOPPED first (seen with the stack on one loaded core: 21 of 22 cuts) it places the
            # answers again as worker_lost; each is still cut mid-stream by the drain and continued elsewhere.
            # That the workers drained rather than died is their exit: by themselves, before the SIGKILL.
            drained = set(exits)
            run.gaps_ms = [gap for name in sorted(drained) for gap in streams.gaps_on.get(name, [])]
            run.handed_over = sum(streams.cut_on.get(name, 0) for name in drained)
            run.drain_s = {name: round(seconds, 2) for name, seconds in zip(exits, drains, strict=True)}
            if not run.handed_over:
                run.outcome.effect_problems.append(
                    "no answer was handed over mid-stream: the scale-down tested nothing"
                )
            if killed := sorted(name for name, seconds in run.drain_s.items() if seconds >= spec.stop_grace_s):
                run.outcome.effect_problems.append(
                    f"{killed} did not exit within the stop grace ({spec.stop_grace_s:.0f} s): SIGKILLed, not drained"
                )
        finally:
            supervisor.cancel()
            stack.stop_all()
            for index in actuator.running(MODEL):  # whatever the actuator left running
                detached.stop(actuator.process(MODEL, index), grace_s=1)
            await actuator.close()
            await dispose(deployment.admin)
    return run
