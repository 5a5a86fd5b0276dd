"""The fault scenarios, each: a stack, a bounded load, one fault injected mid-run, then the audit.

Shared by the CI tests (tests/reliability/test_faults.py, short sizes) and `make reliability`
(long sizes, report in bench/reports/reliability.*). A scenario returns its Outcome; the caller
asserts on it, so the report of a failing scenario is still written.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

from aiokafka import AIOKafkaProducer

from llmbus.bus import Bus
from llmbus.bus.codec import MAX_ID_CHARS
from llmbus.contract import topics as t
from llmbus.settings import BusSettings
from llmbus_tools.harness.reliability.effects import Effect
from llmbus_tools.harness.reliability.stack import (
    Answers,
    ErrorBound,
    Load,
    Outcome,
    PrivateKafka,
    PrivateRedis,
    Stack,
    dispose,
    finish,
    make_request,
    prepare,
    start_and_wait,
)
from llmbus_tools.harness.service_procs import fresh_settings
from tests.reliability.hostile import DUPLICATE, FOREIGN, Hostile, draw_corpus

WORKERS = ["w1", "w2"]
NO_ERRORS: ErrorBound = {}  # nothing a client needs was down: every request must be answered OK
# What hostile records may be answered with (each at most once per hostile record); never `internal`.
CLIENT_INPUT_ERRORS = ("invalid_request", "malformed", "request_too_large", "prompt_too_long", "forbidden")


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


@contextlib.asynccontextmanager
async def running_stack(
    settings: BusSettings, log_dir: Path, workers: list[str] = WORKERS, scheduler_env: dict[str, str] | None = None
) -> AsyncIterator[Stack]:
    """router, scheduler and sim workers on `settings`, supervised; everything killed at the end."""
    await prepare(settings)
    stack = Stack(settings, log_dir)
    stack.router()
    stack.scheduler(env=scheduler_env)
    for worker_id in workers:
        stack.worker(worker_id)
    supervisor = asyncio.create_task(stack.supervise())
    try:
        await start_and_wait(stack, workers)
        yield stack
    finally:
        supervisor.cancel()
        stack.stop_all()


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


async def run_scenario(
    name: str,
    settings: BusSettings,
    stack: Stack,
    size: Size,
    hooks: dict[int, Callable[[int], Awaitable[None]]],
    faults: Faults,
    error_bound: ErrorBound,
    load: Load | None = None,
    effects: list[Effect] | None = None,
) -> Outcome:
    started = time.monotonic()
    answers = await Answers(settings).start()
    faults.started = started
    try:
        load = load or Load(settings, size.requests, size.rate_per_s)
        load.hooks = hooks
        sent = await load.run()
        await faults.done()
        return await finish(
            name,
            settings,
            stack,
            answers,
            sent,
            started,
            answer_timeout_s=size.answer_timeout_s,
            error_bound=error_bound,
            notes=faults.notes,
            effects=effects,
        )
    finally:
        await answers.stop()


# -- scenarios --------------------------------------------------------------------------------


async def sigkill_each_service(size: Size, log_dir: Path) -> Outcome:
    """SIGKILL the router, then the scheduler, then a worker, mid-load; each restarted 2 s later."""
    settings = fresh_settings()
    faults = Faults()

    def kill_then_restart(name: str) -> Callable[[], Awaitable[None]]:
        async def action() -> None:
            stack.kill(name)
            faults.note(f"SIGKILL {name}")
            await asyncio.sleep(2)
            stack.restart(name)
            faults.note(f"{name} restarted")

        return action

    try:
        async with running_stack(settings, log_dir) as stack:
            hooks = {
                at(size, 0.2): faults.spawn(kill_then_restart("router")),
                at(size, 0.45): faults.spawn(kill_then_restart("scheduler")),
                at(size, 0.7): faults.spawn(kill_then_restart("w1")),
            }
            return await run_scenario("sigkill_each_service", settings, stack, size, hooks, faults, NO_ERRORS)
    finally:
        await dispose(settings)


# What a client may get for a request sent while the only broker is down: the scheduler sees no
# heartbeat then (no capacity, attempts burnt), so such a request may end unserved; never `internal`.
OUTAGE_ERRORS = ("model_unavailable", "deadline_exceeded", "max_attempts", "worker_lost", "queue_full")


BROKER_DOWN_S = 3  # between the stop and the start; the broker is down for its start as well (a JVM: 10 s or more)


async def broker_restart(size: Size, log_dir: Path) -> Outcome:
    """Stop the (private) broker (SIGTERM) mid-load, start it again 3 s later; clients keep sending
    throughout. Bound, fixed before the run: at most one `OUTAGE_ERRORS` result per request sent while
    the broker was down (counted as it happens), 0 of any other code."""
    kafka = PrivateKafka(log_dir / "kafka")
    await asyncio.to_thread(kafka.start)
    settings = fresh_settings(kafka_bootstrap=kafka.bootstrap)
    faults = Faults()
    load = Load(settings, size.requests, min(size.rate_per_s, size.requests / 20))  # the load outlasts the outage
    bound: ErrorBound = {}  # filled in by the outage with the count of requests it overlapped

    async def outage() -> None:
        sent_before = len(load.sent_ids)
        stopping = time.monotonic()
        await asyncio.to_thread(kafka.stop)
        await asyncio.sleep(BROKER_DOWN_S)
        await asyncio.to_thread(kafka.start)
        during = len(load.sent_ids) - sent_before
        bound.update(dict.fromkeys(OUTAGE_ERRORS, during))
        down_s = time.monotonic() - stopping
        faults.note(
            f"broker stopped (SIGTERM), started {BROKER_DOWN_S} s later, ready {down_s:.1f} s after the stop began;"
            f" clients sent {during} requests meanwhile"
        )
        if during == 0:
            faults.problems.append("no request was sent while the broker was down: the scenario tested nothing")

    try:
        async with running_stack(settings, log_dir) as stack:
            hooks = {at(size, 0.3): faults.spawn(outage)}
            outcome = await run_scenario("broker_restart", settings, stack, size, hooks, faults, bound, load)
            outcome.effect_problems += faults.problems
            return outcome
    finally:
        with contextlib.suppress(Exception):
            await dispose(settings)
        await asyncio.to_thread(kafka.stop)


async def group_churn(size: Size, log_dir: Path) -> Outcome:
    """Router and scheduler replicas added and removed (SIGTERM, drained) under load."""
    settings = fresh_settings()
    faults = Faults()

    def add(kind: str, name: str) -> Callable[[], Awaitable[None]]:
        async def action() -> None:
            getattr(stack, kind)(name)
            faults.note(f"added {name}")

        return action

    def remove(name: str) -> Callable[[], Awaitable[None]]:
        async def action() -> None:
            await asyncio.to_thread(stack.retire, name)
            faults.note(f"removed {name} (SIGTERM, exit {stack.procs[name].proc.returncode})")  # type: ignore[union-attr]

        return action

    try:
        async with running_stack(settings, log_dir) as stack:
            hooks = {
                at(size, 0.15): faults.spawn(add("router", "router-2")),
                at(size, 0.25): faults.spawn(add("scheduler", "scheduler-2")),
                at(size, 0.45): faults.spawn(remove("router")),
                at(size, 0.55): faults.spawn(remove("scheduler")),
                at(size, 0.65): faults.spawn(add("router", "router-3")),
                at(size, 0.8): faults.spawn(remove("router-2")),
            }
            return await run_scenario("group_churn", settings, stack, size, hooks, faults, NO_ERRORS)
    finally:
        await dispose(settings)


async def redis_restart(size: Size, log_dir: Path) -> Outcome:
    """Private Redis instances: the router's one stopped for 4 s, later the one scheduler and workers share.

    The final markers (who answers a request) live in the bus's Redis, shared by router, scheduler
    and workers, so its outage is one fault; the router's limits and cache are in a Redis of their
    own (LLMBUS_ROUTER_STATE_REDIS_URL).
    """
    router_redis = PrivateRedis(log_dir / "redis-router")
    dispatch_redis = PrivateRedis(log_dir / "redis-dispatch")
    for instance in (router_redis, dispatch_redis):
        await asyncio.to_thread(instance.start)
    settings = fresh_settings(redis_url=dispatch_redis.url)
    faults = Faults()

    def outage(instance: PrivateRedis, who: str) -> Callable[[], Awaitable[None]]:
        async def action() -> None:
            await asyncio.to_thread(instance.stop)
            await asyncio.sleep(4)
            await asyncio.to_thread(instance.start)
            faults.note(f"Redis of the {who} stopped for 4 s, then started (append-only file kept)")

        return action

    try:
        await prepare(settings)
        stack = Stack(settings, log_dir)
        stack.router(env={"LLMBUS_ROUTER_STATE_REDIS_URL": router_redis.url})
        stack.scheduler()
        for worker_id in WORKERS:
            stack.worker(worker_id)
        supervisor = asyncio.create_task(stack.supervise())
        try:
            await start_and_wait(stack, WORKERS)
            hooks = {
                at(size, 0.25): faults.spawn(outage(router_redis, "router")),
                at(size, 0.6): faults.spawn(outage(dispatch_redis, "final markers (router, scheduler, workers)")),
            }
            # Redis down for 2 x 4 s: at most the requests sent meanwhile may end `internal`.
            bound = {"internal": int(size.rate_per_s * 8)}
            return await run_scenario("redis_restart", settings, stack, size, hooks, faults, bound)
        finally:
            supervisor.cancel()
            stack.stop_all()
    finally:
        await dispose(settings)
        for instance in (router_redis, dispatch_redis):
            await asyncio.to_thread(instance.stop)


async def zombie_worker(size: Size, log_dir: Path) -> Outcome:
    """SIGSTOP a worker past the heartbeat timeout (5 s) for 9 s, then SIGCONT: it wakes up as a zombie."""
    settings = fresh_settings()
    faults = Faults()

    async def freeze() -> None:
        stack.signal("w1", signal.SIGSTOP)
        await asyncio.sleep(9)
        stack.signal("w1", signal.SIGCONT)
        faults.note("w1 SIGSTOPped for 9 s (heartbeat timeout 5 s), then SIGCONTed")

    try:
        async with running_stack(settings, log_dir) as stack:
            hooks = {at(size, 0.4): faults.spawn(freeze)}
            return await run_scenario("zombie_worker", settings, stack, size, hooks, faults, NO_ERRORS)
    finally:
        await dispose(settings)


async def hostile_fuzz(size: Size, log_dir: Path) -> Outcome:
    """Hostile records (Hypothesis) mixed into the valid load: each ends as a result or a DLQ entry."""
    settings = fresh_settings()
    corpus = draw_corpus(size.hostile)
    every = max(1, size.requests // max(1, size.hostile))
    faults = Faults()
    sent_hostile_ids: list[str] = []
    valid_ids: list[str] = []
    refused: list[str] = []

    try:
        async with running_stack(settings, log_dir) as stack:
            bus = await Bus.start(settings, t.CLIENT, client_suffix="-fuzz")
            # Not idempotent: a record the broker refuses (too large) must not poison the next ones' sequence.
            raw = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", max_request_size=4 * 2**20)
            await asyncio.wait_for(raw.start(), 30)
            topic = bus.topics.name(t.REQUESTS)
            queue = list(corpus)

            async def send_hostile(i: int) -> None:
                for _ in range(max(1, size.hostile // size.requests)):
                    if not queue:
                        return
                    record = _resolve(queue.pop(), valid_ids)
                    key = record.key if record.key is not None or record.value is not None else b"tombstone"
                    try:  # raw bytes, raw key, no headers: what any outside client can write
                        delivery = await asyncio.wait_for(raw.send(topic, record.value, key=key), 15)
                        await asyncio.wait_for(delivery, 15)
                    except Exception as exc:  # noqa: BLE001 - the broker refusing a record is an outcome too
                        refused.append(f"{record.kind}: {type(exc).__name__}")
                        continue
                    if record.request_id is not None and _answerable(record.request_id):
                        sent_hostile_ids.append(record.request_id)

            load = Load(settings, size.requests, size.rate_per_s)

            def make(i: int, rng):  # type: ignore[no-untyped-def]
                request = make_request(i, rng)
                valid_ids.append(request.request_id)
                return request

            hooks = {i: send_hostile for i in range(1, size.requests, every)}
            started = time.monotonic()
            answers = await Answers(settings).start()
            try:
                load.hooks = hooks
                sent = await load.run(make)
                while queue:  # whatever the hooks did not place
                    await send_hostile(0)
            finally:
                await asyncio.wait_for(raw.stop(), 30)
                await bus.stop()
            try:
                faults.note(
                    f"{size.hostile} hostile records drawn, {len(sent_hostile_ids)} with a request id, "
                    f"{len(refused)} refused by the broker ({sorted(set(refused))[:5]})"
                )
                return await finish(
                    "hostile_fuzz",
                    settings,
                    stack,
                    answers,
                    [*sent, *sent_hostile_ids],
                    started,
                    answer_timeout_s=size.answer_timeout_s,
                    error_bound=dict.fromkeys(CLIENT_INPUT_ERRORS, size.hostile),
                    account_requests=True,
                    notes=faults.notes,
                )
            finally:
                await answers.stop()
    finally:
        await dispose(settings)


def _answerable(request_id: str) -> bool:
    """Ids judged one by one (exactly one result each): those a request can carry and the router can
    answer under (`llmbus.bus.codec`: 1..128 printable characters). Not these: an id with a lone
    surrogate is no UTF-8 text, so no Kafka key or result can carry it; a longer one or one with
    CR/LF is refused without an answer when the rest of the request is bad too; "" names nobody.
    Their records must still end as a result or in the DLQ (the audit's account of llm.requests)."""
    return 0 < len(request_id) <= MAX_ID_CHARS and request_id.isprintable()


def _resolve(record: Hostile, valid_ids: list[str]) -> Hostile:
    """Duplicated and foreign ids take the id of a valid request already sent."""
    if record.value is None or not valid_ids or record.request_id not in (DUPLICATE, FOREIGN):
        return record
    target = f'"{valid_ids[len(valid_ids) // 2]}"'.encode()
    value = record.value.replace(b'"\\u0000duplicate"', target).replace(b'"\\u0000foreign"', target)
    return Hostile(record.kind, record.key, value)


SCENARIOS: dict[str, Callable[[Size, Path], Awaitable[Outcome]]] = {
    "sigkill_each_service": sigkill_each_service,
    "broker_restart": broker_restart,
    "group_churn": group_churn,
    "redis_restart": redis_restart,
    "zombie_worker": zombie_worker,
    "hostile_fuzz": hostile_fuzz,
}
