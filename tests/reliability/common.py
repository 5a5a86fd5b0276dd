"""What every fault scenario is made of: its size, its run (the session's secured broker, a log
directory), the stack as deployed with cost-accounting in it, fault actions beside the load, and the
verdict: the delivery audit, the errors it allowed, billing conserved, and its own effects.

A scenario module (tests/reliability/scenarios/) builds on these and registers one `Scenario`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from llmbus.contract import topics as t
from llmbus_tools.harness.reliability.deployment import Deployment
from llmbus_tools.harness.reliability.effects import Billing, Effect, group_members
from llmbus_tools.harness.reliability.infra import PrivateRedis
from llmbus_tools.harness.reliability.load import Answers, Load
from llmbus_tools.harness.reliability.stack import Stack
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome, dispose, finish
from llmbus_tools.harness.secured import SecuredBroker

WORKERS = ["w1", "w2"]


@dataclass(frozen=True)
class Size:
    requests: int
    rate_per_s: float
    hostile: int  # fuzz scenario: hostile records mixed in
    answer_timeout_s: float


SHORT = Size(requests=160, rate_per_s=40, hostile=80, answer_timeout_s=120)
LONG = Size(requests=3000, rate_per_s=40, hostile=2000, answer_timeout_s=180)


def sized(size: Size, requests: str | None) -> Size:
    """`size` with another request count (hostile records scaled alike); None keeps it."""
    if not requests:
        return size
    count = int(requests)
    return replace(size, requests=count, hostile=max(1, size.hostile * count // size.requests))


@dataclass
class Run:
    """One scenario's run: its size, where its logs go, the session's secured broker (None for a scenario
    that starts and breaks its own), the Redis servers it started (`close` stops them)."""

    size: Size
    log_dir: Path
    broker: SecuredBroker | None
    redises: list[PrivateRedis] = field(default_factory=list)

    def deployment(self, broker: SecuredBroker | None = None, **overrides: object) -> Deployment:
        """A fresh namespace on `broker` (the session's unless the scenario started its own), on a Redis of
        its own with the namespace's ACL users as deployed (`deployment.redis`: a scenario may break it),
        unless `overrides` name another Redis (`redis_url`: a Redis Cluster, without ACL users)."""
        on = broker or self.broker
        assert on is not None, "a scenario with its own broker passes it"
        deployment = Deployment.on(on, **overrides)
        return deployment if "redis_url" in overrides else deployment.with_redis(self.redis(deployment))

    def redis(self, deployment: Deployment, name: str = "redis") -> PrivateRedis:
        """Another Redis with `deployment`'s ACL users, started; stopped by `close`."""
        redis = deployment.own_redis(self.log_dir / name)
        self.redises.append(redis)
        redis.start()
        return redis

    def close(self) -> None:
        """Stops the Redis servers the run started."""
        for redis in self.redises:
            with contextlib.suppress(Exception):
                redis.stop()


def at(size: Size, fraction: float) -> int:
    return int(size.requests * fraction)


class Faults:
    """Fault actions started from load hooks; they run beside the load, which keeps sending."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []
        self.notes: list[str] = []
        self.problems: list[str] = []  # the fault did not test what it should (judged like an effect)
        self.started = time.monotonic()

    def note(self, what: str) -> None:
        self.notes.append(f"t+{time.monotonic() - self.started:.1f}s {what}")

    def spawn(self, action: Callable[[], Awaitable[None]]) -> Callable[[int], Awaitable[None]]:
        async def hook(_: int) -> None:
            self.tasks.append(asyncio.create_task(action()))

        return hook

    async def done(self) -> None:
        await asyncio.gather(*self.tasks)


@dataclass
class Deployed:
    """A running stack and what judges it besides the audit: the billing effect is always there."""

    stack: Stack
    billing: Billing
    effects: list[Effect] = field(default_factory=list)

    @property
    def deployment(self) -> Deployment:
        return self.stack.deployment


@contextlib.asynccontextmanager
async def deployed(
    deployment: Deployment,
    log_dir: Path,
    workers: list[str] = WORKERS,
    build: Callable[[Stack], None] | None = None,
    keep_namespace: bool = False,
    env: dict[str, dict[str, str]] | None = None,
    before_start: Callable[[Deployment], Awaitable[None]] | None = None,
    ready_timeout_s: float = 180,
) -> AsyncIterator[Deployed]:
    """The namespace made ready (ACLs, topics), then router, scheduler, `workers` and cost-accounting as
    their own principals (`env`: a service's own settings, by its name in the stack), plus whatever
    `build` adds; supervised, killed at the end, the namespace dropped (unless `keep_namespace`: a
    private broker goes with its data); `ready_timeout_s`: how long the workers may take to start."""
    await deployment.prepare()
    if before_start is not None:  # what the services must find at their start (an experiment, a model)
        await before_start(deployment)
    own = env or {}
    stack = Stack(deployment, log_dir)
    stack.router(env=own.get("router"))
    stack.scheduler(env=own.get("scheduler"))
    for worker_id in workers:
        stack.worker(worker_id, own.get(worker_id))
    stack.cost(env=own.get("cost"))
    if build is not None:
        build(stack)
    supervisor = asyncio.create_task(stack.supervise())
    billing: Billing | None = None
    try:
        await stack.workers_ready(workers, ready_timeout_s)
        await rejoined(deployment, deployment.topics.group(t.COST, "results"), set())
        billing = await Billing(deployment.operator).start()
        yield Deployed(stack, billing)
    finally:
        supervisor.cancel()
        stack.stop_all()
        if billing is not None:
            await billing.stop()
        if not keep_namespace:
            with contextlib.suppress(Exception):
                await dispose(deployment.admin)


async def rejoined(deployment: Deployment, group: str, before: set[str], timeout_s: float = 120) -> set[str]:
    """Until a member not in `before` holds `group` (a restarted process consumes again)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not (members := await group_members(deployment.admin, group)) or members <= before:
        if loop.time() > deadline:
            raise TimeoutError(f"nobody new joined {group} within {timeout_s:.0f} s")
        await asyncio.sleep(0.2)
    return members


def kill_then_restart(stack: Stack, faults: Faults, name: str, down_s: float = 2.0) -> Callable[[], Awaitable[None]]:
    """SIGKILL `name`, restart it `down_s` later."""

    async def action() -> None:
        stack.kill(name)
        faults.note(f"SIGKILL {name}")
        await asyncio.sleep(down_s)
        stack.restart(name)
        faults.note(f"{name} restarted")

    return action


def kill_twice(stack: Stack, faults: Faults, name: str, group: str) -> Callable[[], Awaitable[None]]:
    """SIGKILL `name`, restart it 1 s later; once the new process holds its group (a SIGKILLed member
    keeps its partitions until its session times out), the same again: the second kill meets a process
    that is taking over the first one's uncommitted work."""

    async def action() -> None:
        for n in (1, 2):
            before = await group_members(stack.deployment.admin, group)
            stack.kill(name)
            faults.note(f"SIGKILL {name} ({n})")
            await asyncio.sleep(1)
            stack.restart(name)
            await rejoined(stack.deployment, group, before)
            faults.note(f"{name} restarted and rejoined its group")
            await asyncio.sleep(0.5)

    return action


async def run_scenario(
    name: str,
    running: Deployed,
    size: Size,
    hooks: dict[int, Callable[[int], Awaitable[None]]],
    faults: Faults,
    budget: ErrorBudget,
    load: Load | None = None,
    account_requests: bool = False,
    extra_ids: Callable[[], list[str]] | None = None,
    before_finish: Callable[[], None] | None = None,
) -> Outcome:
    """The load with `hooks`, the faults awaited (then `before_finish`), then the verdict (`finish`): the
    audit over the ids sent (and `extra_ids()`), `budget`, billing conserved and the scenario's own effects."""
    started = time.monotonic()
    answers = await Answers(running.deployment).start()
    faults.started = started
    try:
        load = load or Load(running.deployment, size.requests, size.rate_per_s)
        load.hooks = hooks
        sent = await load.run()
        await faults.done()
        if before_finish is not None:
            before_finish()
        outcome = await finish(
            name,
            running.stack,
            answers,
            [*sent, *(extra_ids() if extra_ids else [])],
            started,
            answer_timeout_s=size.answer_timeout_s,
            budget=budget,
            account_requests=account_requests,
            notes=faults.notes,
            effects=[running.billing, *running.effects],
        )
    finally:
        await answers.stop()
    outcome.effect_problems += faults.problems
    return outcome


@dataclass(frozen=True)
class Scenario:
    """One fault scenario, as the registry (tests/reliability/scenarios) finds it in its module."""

    name: str
    run: Callable[[Run], Awaitable[Outcome]]
    fault: str  # what is broken, in a line
    # More JVMs or processes than `make test` carries on two cores: `make reliability` only.
    heavy: bool = False
    own_broker: bool = False  # it starts (and breaks) a broker of its own: the session's is not started for it
    short_timeout_s: int = 300  # the short size's limit (the long one's is the suite's)
    vllm: bool = False  # vLLM CPU engines beside the stack: the `vllm` mark (skipped where vLLM is not installed)
