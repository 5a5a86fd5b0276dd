"""One runtime for every service: its declared subscriptions, the one Publisher, timers, start phases, drain, stop.

A service declares what it reads and writes once (llmbus.contract.contracts); its app.py binds each
declared subscription to a handler here, names its start-up jobs, timers and clean-ups, and calls
`run`. Everything it publishes goes through the Bus's Publisher (retries, batches kept through a
leader change, a new producer when the broker refuses the old one's sequence). llmbus.bus.memory
runs the same bindings in memory for unit tests.

Start, in phases (`Phase`); a phase that fails stops everything started before it, then raises:
  STARTING  timers and tasks that run through the whole start (a worker's heartbeats)
  TABLES    start-up jobs in order: tables read (`read_table`), state restored, an engine warmed up
  FOLLOWED  the followed state (group-less subscriptions from the log's start: models, experiments,
            the fleet) read to its end as of the start, `catch_up_s` at most; then `caught_up` is set
            (later, by a watcher, if that time ran out) and `replayed` tells those records apart
  SERVING   every other subscription runs (from-latest and per-instance ones placed in their group
            first); then the readiness jobs, and `ready` is set
Every consumer starts at once after TABLES: group joins, the slow part of a start, overlap the catch-up.

Stop (SIGTERM, or a loop or task that failed): the drain jobs run (a worker says it is draining),
every loop stops polling and lets its records finish (`drain_grace_s`; then `grace_over`, then
`stop_timeout_s`, then they are cancelled, uncommitted) and commits; then timers and tasks end,
consumers close, the clean-up jobs run (last registered first) and the producer is closed. A failure
is raised after all of that: the process exits non-zero and its supervisor restarts it.

Delivery (at least once; commits in offset order after the handler; bad records to llm.dlq;
transient failures retried in place unless `retries=False`) is docs/delivery.md's "On the bus".

Why FastStream is not the consumer engine, though the project's design card names it: measured on
the same handler (bench/runtime_engine_bench.py, docs/architecture.md), its configurations that
commit after the handler carry 0.42-0.71x ConsumerLoop's records/s at 1.35-1.84x its CPU per record,
the one with ordered commits (faststream-concurrent-aiokafka) redelivers 5x as many records after a
SIGKILL, and its default ack policy commits as it fetches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiokafka.structs import ConsumerRecord, TopicPartition

from llmbus.bus.bindings import RETRY_FIRST_S, Binding, GraceOver, RevokeHook, handler_for, transient
from llmbus.bus.consumer import ErrorHandler
from llmbus.bus.holds import Holds
from llmbus.bus.retry_watch import RetryWatch
from llmbus.bus.runtime import Bus
from llmbus.bus.service_reads import ServiceReads
from llmbus.bus.subscriptions import Subscriptions
from llmbus.contract.declarations import Contract
from llmbus.process.heap import freeze_started
from llmbus.process.periodic import cancelled_at_stop, run_every
from llmbus.settings import BusSettings

log = logging.getLogger(__name__)

__all__ = ["Binding", "Phase", "ServiceRuntime", "cancelled_at_stop", "transient"]  # cancelled_at_stop: periodic

Job = Callable[[], Awaitable[object]]
Task = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
TASK_GRACE_S = 5.0
HOW_READ = {"batch_max_records", "max_in_flight"}  # what a service's settings may change in a declaration


class Phase(enum.IntEnum):
    STARTING = 0
    TABLES = 1
    FOLLOWED = 2
    SERVING = 3


class ServiceRuntime(ServiceReads):
    """The bindings, jobs, timers and life cycle of one service over a Bus (real, or llmbus.bus.memory's)."""

    def __init__(
        self, bus: Bus, contract: Contract, *, max_attempts: int | None = None, retry_first_s: float = RETRY_FIRST_S
    ) -> None:
        """`max_attempts`: a transient failure is raised after so many (None: retried until it
        succeeds or the service stops; the in-memory double bounds it, and a test sees it)."""
        if contract.service != bus.service:
            raise ValueError(f"contract of {contract.service} on the bus of {bus.service}")
        self.bus = bus
        self.contract = contract
        self.bindings: list[Binding] = []
        self.caught_up = asyncio.Event()  # the followed state is read to where it ended at the start
        self.ready = asyncio.Event()  # every phase is through: the service serves
        self._jobs: dict[Phase, list[Job]] = {phase: [] for phase in Phase}
        self._background: list[tuple[Phase, str, Task]] = []
        self._drain_jobs: list[Job] = []
        self._stop_jobs: list[Job] = []
        self._subscriptions: Subscriptions | None = None
        self._loop_tasks: list[asyncio.Task[None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._replay_ends: dict[TopicPartition, int] = {}
        self._failures: list[BaseException] = []
        self._stopping = asyncio.Event()  # asked to stop, or something failed
        self._loops_stop = asyncio.Event()  # the loops stop polling and drain
        self._tasks_stop = asyncio.Event()  # timers and tasks end
        self._drained: asyncio.Task[None] | None = None
        self._closed = False
        self._max_attempts = max_attempts
        self._retry_first_s = retry_first_s
        # Records retried in place; one retried past the watchdog's time makes the service not live.
        self.retry_watch = RetryWatch(contract.service, bus.settings.watchdog_s)

    @classmethod
    async def connect(cls, settings: BusSettings, contract: Contract, client_suffix: str = "") -> ServiceRuntime:
        return cls(await Bus.start(settings, contract.service, client_suffix), contract)

    @classmethod
    async def serve(
        cls,
        settings: BusSettings,
        contract: Contract,
        build: Callable[[ServiceRuntime], Awaitable[object] | object],
        stop: asyncio.Event,
        *,
        client_suffix: str = "",
    ) -> None:
        """A service's whole life: connect, `build` (its declarations; a failure there stops what was
        connected), then `run` until `stop`."""
        runtime = cls(await Bus.start(settings, contract.service, client_suffix), contract)
        try:
            if inspect.isawaitable(built := build(runtime)):
                await built
        except BaseException:
            await runtime.stop()
            raise
        await runtime.run(stop)

    # -- declarations ------------------------------------------------------------------------
    def subscribe(
        self,
        name: str,
        handler: Callable[[Any], Awaitable[object]],
        *,
        pattern: str | None = None,
        consumer_options: dict[str, object] | None = None,
        holds: Holds[Any] | None = None,
        names: dict[str, str] | None = None,
        on_error: ErrorHandler | None = None,
        on_revoke: RevokeHook | None = None,
        drain_grace_s: float | None = None,
        grace_over: GraceOver | None = None,
        retries: bool = True,
        **overrides: Any,
    ) -> None:
        """Bind the declared subscription `name` to `handler` (a typed one gets the decoded message,
        a `raw` one the record, a batch one the list of records). `overrides` change how it is read
        (batch size, concurrency), never what: a subscription's topics are its declaration's, with
        `names` filling their placeholders. The other options are Binding's."""
        if unknown := set(overrides) - HOW_READ:
            raise ValueError(f"a subscription reads what its declaration names: {sorted(unknown)} cannot change")
        reads = dataclasses.replace(self.contract.subscription(name), **overrides)
        if reads.at_start:
            raise ValueError(f"{name!r} is read once at start (read_table), not followed")
        if reads.on_demand:
            raise ValueError(f"{name!r} is looked up on demand (llmbus.bus.replies), not followed")
        binding = Binding(
            reads,
            handler,
            pattern,
            dict(consumer_options or {}),
            holds,
            dict(names or {}),
            on_error,
            on_revoke,
            drain_grace_s,
            grace_over,
            retries,
        )
        self.bindings.append(binding)

    def on_start(self, job: Job, phase: Phase = Phase.TABLES) -> None:
        """A start-up job, run in order with the others of its phase: TABLES before anything is followed,
        FOLLOWED once the followed state is caught up, SERVING once every subscription runs (readiness)."""
        if phase == Phase.STARTING:
            raise ValueError("STARTING has timers and tasks only; a job runs in TABLES at the earliest")
        self._jobs[phase].append(job)

    def every(
        self, interval_s: float, name: str, job: Job, *, at_once: bool = False, phase: Phase = Phase.SERVING
    ) -> None:
        """A periodic job from the end of `phase` until the loops have drained; a failed run is logged
        and the next one comes at the next interval."""

        async def timer(stop: asyncio.Event) -> None:
            await run_every(interval_s, job, name=name, stop=stop, at_once=at_once)

        self._background.append((phase, name, timer))

    def task(self, name: str, run: Task, *, phase: Phase = Phase.SERVING) -> None:
        """A task from the end of `phase`, told to stop (its event set) once the loops have drained and
        cancelled if it has not ended `stop_timeout_s` + 5 s later; if it fails, the service stops."""
        self._background.append((phase, name, run))

    def on_drain(self, job: Job) -> None:
        """Run when the service is told to stop, before its loops stop taking records."""
        self._drain_jobs.append(job)

    def on_stop(self, job: Job) -> None:
        """A clean-up, run at every stop (a failed start's too) after the loops and tasks ended, before
        the producer closes; the last registered runs first. A clean-up that fails is logged."""
        self._stop_jobs.append(job)

    # -- facilities --------------------------------------------------------------------------
    @property
    def live(self) -> bool:
        """No record has been retried in place for longer than the watchdog's time (llmbus.bus.retry_watch)."""
        return self.retry_watch.live

    @property
    def failed(self) -> bool:
        """The start, a loop or a task failed (the service stops, or has stopped, because of it)."""
        return bool(self._failures)

    def replayed(self, record: ConsumerRecord) -> bool:
        """A record of the followed state written before this process started following it."""
        return record.offset < self._replay_ends.get(TopicPartition(record.topic, record.partition), 0)

    async def dead_letter(self, record: ConsumerRecord, exc: Exception) -> None:
        """The one DLQ path, for handlers that dead-letter one record of a batch themselves."""
        await self.bus.dead_letter(record, exc)

    def record_handler(self, binding: Binding) -> Callable[[Any], Awaitable[None]]:
        """What the consumer calls for a record (or a batch) of `binding`."""
        return handler_for(
            binding,
            self.contract.service,
            max_attempts=self._max_attempts,
            retry_first_s=self._retry_first_s,
            watch=self.retry_watch,
        )

    # -- life cycle --------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Start, serve until `stop` is set or something fails, drain, stop (a failure is raised last)."""
        try:
            await self.start()
            await self.wait(stop)
        finally:
            await self.stop()

    async def start(self) -> None:
        """Every phase in order; if one fails, what was started is stopped and the error raised."""
        try:
            await self._start_background(Phase.STARTING)
            await self._run_jobs(Phase.TABLES)
            await self._start_background(Phase.TABLES)
            await self._open_loops()
            await self._follow()
            await self._run_jobs(Phase.FOLLOWED)
            await self._start_background(Phase.FOLLOWED)
            await self._serve()
            await self._start_background(Phase.SERVING)
            await self._run_jobs(Phase.SERVING)
        except BaseException as exc:
            self._failures.append(exc)
            await self.stop()
            raise
        freeze_started()
        self.ready.set()

    async def wait(self, stop: asyncio.Event) -> None:
        """Until `stop` is set or a loop or task fails; then drained (the first failure is raised)."""
        forward = asyncio.create_task(_set_when(stop, self._stopping))
        try:
            await self._stopping.wait()
        finally:
            forward.cancel()
        await self._drain()
        if self._failures:
            for failure in self._failures[1:]:
                log.error("stopping: %s", failure)
            raise self._failures[0]

    async def stop(self) -> None:
        """Drain (in-flight records finish or stay uncommitted), commit, close consumers, clean up,
        close the producer. Safe to call more than once, and after a failed start."""
        self._stopping.set()
        await self._drain()
        if self._closed:
            return
        self._closed = True
        self.ready.clear()
        await self._close_consumers()
        for job in reversed(self._stop_jobs):
            try:
                await job()
            except Exception:
                log.warning("clean-up %s failed", getattr(job, "__qualname__", job), exc_info=True)
        await self.bus.stop()

    async def _run_jobs(self, phase: Phase) -> None:
        for job in self._jobs[phase]:
            await job()

    async def _start_background(self, phase: Phase) -> None:
        """The phase's timers and tasks, begun before the next phase's jobs (one turn of the loop)."""
        for started_at, name, run in self._background:
            if started_at == phase:
                self._watch(asyncio.create_task(run(self._tasks_stop), name=name), self._tasks)
        await asyncio.sleep(0)

    def _watch(self, task: asyncio.Task[None], into: list[asyncio.Task[None]]) -> None:
        into.append(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A loop or task that fails stops the service (its error is raised after the drain)."""
        if task.cancelled() or (failure := task.exception()) is None:
            return
        if not self._stopping.is_set():
            log.error("%s failed: stopping", task.get_name(), exc_info=failure)
        self._failures.append(failure)
        self._stopping.set()

    async def _drain(self) -> None:
        """Once, however many callers wait for it."""
        if self._drained is None:
            self._drained = asyncio.create_task(self._drain_once())
        await asyncio.shield(self._drained)

    async def _drain_once(self) -> None:
        for job in self._drain_jobs:
            try:
                await job()
            except Exception:
                log.warning("drain step %s failed", getattr(job, "__qualname__", job), exc_info=True)
        self._loops_stop.set()
        await asyncio.gather(*self._loop_tasks, return_exceptions=True)
        self._tasks_stop.set()
        if self._tasks:  # bounded past an HTTP server's own graceful shutdown (stop_timeout_s)
            _, pending = await asyncio.wait(self._tasks, timeout=self.settings.stop_timeout_s + TASK_GRACE_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- consumers (the in-memory runtime has none: llmbus.bus.memory) -----------------------
    async def _open_loops(self) -> None:
        self._subscriptions = Subscriptions(self.bus, self.bindings, self.record_handler)
        await self._subscriptions.open()

    async def _follow(self) -> None:
        """The followed state read to its end as of now, `catch_up_s` at most (then a watcher sets
        `caught_up` when it gets there); where it ended is kept for `replayed`."""
        subscriptions = self._subscriptions
        assert subscriptions is not None
        self._replay_ends = await subscriptions.replay_ends()
        for name, run in subscriptions.runs(self._loops_stop, follows=True):
            self._watch(asyncio.create_task(run, name=name), self._loop_tasks)
        if await subscriptions.caught_up(self.settings.catch_up_s):
            self.caught_up.set()
            return
        log.warning("followed state not caught up within %.1fs; serving anyway", self.settings.catch_up_s)
        watcher = subscriptions.caught_up_later(self._tasks_stop, self.caught_up)
        self._watch(asyncio.create_task(watcher, name="catch-up watch"), self._tasks)

    async def _serve(self) -> None:
        subscriptions = self._subscriptions
        assert subscriptions is not None
        await subscriptions.joined()
        for name, run in subscriptions.runs(self._loops_stop, follows=False):
            self._watch(asyncio.create_task(run, name=name), self._loop_tasks)

    async def _close_consumers(self) -> None:
        if self._subscriptions is not None:
            await self._subscriptions.close()


async def _set_when(stop: asyncio.Event, then: asyncio.Event) -> None:
    await stop.wait()
    then.set()
