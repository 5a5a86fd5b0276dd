"""The scheduler process on the real broker and Redis, against scripted workers.

The test plays the workers: it publishes their heartbeats, reads what lands on their
dispatch topics and answers with DispatchOutcomes, so every recovery path can be forced.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from llmbus.bus import Bus, decode
from llmbus.bus.admin import ensure_topics, open_admin
from llmbus.client import TopicTail, collect_results
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Dispatch,
    DispatchOutcome,
    ErrorCode,
    ErrorInfo,
    InferenceRequest,
    OutcomeStatus,
    ResultStatus,
    RoutedRequest,
    WorkerState,
    WorkerStatus,
    now_ms,
)
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import ServiceProc
from tests.support import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.redis]
MODEL = "m-test"


class ScriptedFleet:
    """Heartbeats for fake workers (while `alive`), their dispatch topics, and a way to answer."""

    def __init__(self, settings: BusSettings, bus: Bus, **status_fields: object) -> None:
        self.settings = settings
        self.bus = bus
        self.topics = t.Topics(settings.topic_prefix)
        self.alive: dict[str, dict[str, object]] = {}
        self.status_fields = status_fields
        self.tails: dict[str, TopicTail] = {}
        self._task: asyncio.Task[None] | None = None

    async def add(self, worker_id: str, models: list[str] | None = None, **fields: object) -> None:
        topic = self.topics.dispatch(worker_id)
        await ensure_topics(self.settings, [(topic, t.DISPATCH_SPEC)])
        self.tails[worker_id] = await TopicTail(self.settings, topic).start()
        # One process per worker id: a later start in a heartbeat is the id restarted (its requests placed again).
        started = {"started_at_ms": now_ms()}
        self.alive[worker_id] = {"models": models or [MODEL], **started, **self.status_fields, **fields}
        await self._beat(worker_id)

    async def _beat(self, worker_id: str) -> None:
        fields = dict(self.alive[worker_id])
        status = WorkerStatus(
            worker_id=worker_id,
            node_id="n1",
            state=WorkerState.READY,
            engine="sim",
            dispatch_topic=self.topics.dispatch(worker_id),
            max_model_len=8192,
            kv_blocks_total=10_000,
            kv_blocks_free=10_000,
            **fields,
        )  # type: ignore[arg-type]
        await self.bus.publisher.publish(self.topics.name(t.WORKERS), status, key=worker_id)

    async def _loop(self) -> None:
        while True:
            for worker_id in list(self.alive):
                await self._beat(worker_id)
            await asyncio.sleep(0.3)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    def kill(self, worker_id: str) -> None:
        self.alive.pop(worker_id, None)  # no more heartbeats: what a dead worker looks like

    async def dispatches(self, want: int, timeout_s: float = 20) -> list[Dispatch]:
        """Dispatches on every fake worker's topic until `want` arrived (or the time is up)."""
        got: list[Dispatch] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(got) < want and loop.time() < deadline:
            for tail in self.tails.values():
                async for record in tail.records(0.2):
                    got.append(decode(record, Dispatch))  # type: ignore[arg-type]
        return got

    async def answer(self, dispatch: Dispatch, status: OutcomeStatus, code: ErrorCode | None = None) -> None:
        outcome = DispatchOutcome(
            request_id=dispatch.request_id,
            tenant=dispatch.routed.request.tenant,
            worker_id=dispatch.worker_id,
            attempt=dispatch.attempt,
            status=status,
            model=dispatch.routed.model,
            error=ErrorInfo.of(code, "scripted") if code else None,
        )
        await self.bus.publisher.publish(self.topics.name(t.OUTCOMES), outcome, key=dispatch.request_id)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for tail in self.tails.values():
            await tail.stop()


async def routed_committed(settings: BusSettings, records: int) -> bool:
    """The scheduler's group has committed `records` records of llm.routed (in a fresh namespace offsets
    start at 0, so the committed offsets add up to the records handled)."""
    topics = t.Topics(settings.topic_prefix)
    async with open_admin(settings) as admin:
        committed = await asyncio.wait_for(admin.list_consumer_group_offsets(topics.group(t.SCHEDULER)), 10)
    return sum(meta.offset for tp, meta in committed.items() if tp.topic == topics.name(t.ROUTED)) >= records


async def send_routed(bus: Bus, n: int, model: str = MODEL, **request_fields: object) -> list[str]:
    ids = []
    for _ in range(n):
        request = InferenceRequest(prompt="hello " * 20, max_tokens=16, model=model, **request_fields)  # type: ignore[arg-type]
        routed = RoutedRequest(request=request, model=model)
        await bus.publisher.publish(bus.topics.name(t.ROUTED), routed, key=model, request_id=request.request_id)
        ids.append(request.request_id)
    return ids


@contextlib.asynccontextmanager
async def scheduler_setup(
    settings: BusSettings, services: list[ServiceProc], env: dict[str, str], instances: int = 1, **status_fields: object
):  # type: ignore[no-untyped-def]
    bus = await Bus.start(settings, "test")
    fleet = ScriptedFleet(settings, bus, **status_fields)
    results = await TopicTail(settings, t.Topics(settings.topic_prefix).name(t.RESULTS)).start()
    base_env = {"LLMBUS_SCHEDULER_HEARTBEAT_STALE_S": "2", "LLMBUS_SCHEDULER_TICK_MS": "100"} | env
    for i in range(instances):
        services.append(
            ServiceProc(
                "llmbus_services.scheduler",
                settings,
                name=f"scheduler{i}",
                env=base_env | {"LLMBUS_SCHEDULER_INSTANCE_ID": f"s{i}-{uuid.uuid4().hex[:6]}"},
            ).start()
        )
    try:
        yield bus, fleet, results
    finally:
        await fleet.stop()
        await results.stop()
        await bus.stop()


async def test_dead_worker_requests_are_placed_again_on_a_live_worker(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    async with scheduler_setup(bus_settings, services, {}) as (bus, fleet, _results):
        await fleet.add("w1")
        fleet.start()
        ids = await send_routed(bus, 3)
        first = await fleet.dispatches(3, timeout_s=40)
        assert sorted(d.request_id for d in first) == sorted(ids)
        assert {(d.worker_id, d.attempt) for d in first} == {("w1", 1)}
        await fleet.add("w2")
        fleet.kill("w1")
        again = await fleet.dispatches(3, timeout_s=20)
        assert sorted(d.request_id for d in again) == sorted(ids)
        assert {(d.worker_id, d.attempt) for d in again} == {("w2", 2)}
        assert all(d.routed.request.prompt == first[0].routed.request.prompt for d in again)


async def test_retryable_failure_goes_to_another_worker_then_max_attempts(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    env = {"LLMBUS_SCHEDULER_MAX_ATTEMPTS": "2"}
    async with scheduler_setup(bus_settings, services, env) as (bus, fleet, results):
        await fleet.add("w1")
        await fleet.add("w2")
        fleet.start()
        await asyncio.sleep(1.0)  # both workers known before the request arrives
        [rid] = await send_routed(bus, 1)
        [first] = await fleet.dispatches(1, timeout_s=40)
        # (an OOM retries only where more KV is free: tests/unit/test_sched_worker_refusals.py)
        await fleet.answer(first, OutcomeStatus.RETRYABLE, ErrorCode.ENGINE_FAILED)
        [second] = await fleet.dispatches(1)
        assert second.request_id == rid and second.attempt == 2 and second.worker_id != first.worker_id
        from llmbus.state.store import dispatch_markers, redis_client

        client = redis_client(bus_settings.redis_url)
        try:  # a redelivery of attempt 1 (its worker restarting) will be skipped, not run twice
            assert await dispatch_markers(client, bus_settings.topic_prefix).superseded(second.request_key, 1)
        finally:
            await client.aclose()
        await fleet.answer(second, OutcomeStatus.RETRYABLE, ErrorCode.OVER_CAPACITY)
        found = await collect_results(bus_settings, {rid}, timeout_s=10, tail=results)
        [result] = found[rid]
        assert result.status == ResultStatus.ERROR and result.error is not None
        # The error goes out as attempt 3: attempt 2 ran and may have streamed, and a final chunk under its
        # number (seq 0) would collide with its first chunk; readers drop attempt 2's text and end on the error.
        assert result.error.code == ErrorCode.MAX_ATTEMPTS and result.attempt == 3
        assert await fleet.dispatches(1, timeout_s=1) == []  # nothing placed a third time


async def test_queue_is_bounded_releases_on_capacity_and_times_out_at_deadline(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    env = {"LLMBUS_SCHEDULER_MAX_QUEUED_PER_MODEL": "2", "LLMBUS_SCHEDULER_NO_WORKER_TIMEOUT_S": "30"}
    async with scheduler_setup(bus_settings, services, env, max_num_seqs=1) as (bus, fleet, results):
        await fleet.add("w1")
        fleet.start()
        await asyncio.sleep(1.0)
        [placed_id] = await send_routed(bus, 1)
        [placed] = await fleet.dispatches(1, timeout_s=40)
        assert placed.request_id == placed_id
        waiting = await send_routed(bus, 1)  # no deadline: waits for capacity
        late = await send_routed(bus, 1, deadline_ms=now_ms() + 2500)
        refused = await send_routed(bus, 2)  # the queue holds two: these are refused
        # One read of the results for both: a tail consumes what it reads.
        found = await collect_results(bus_settings, set(refused) | set(late), timeout_s=8, tail=results)
        assert {r: [x.error.code for x in found.get(r, [])] for r in refused} == {
            r: [ErrorCode.QUEUE_FULL] for r in refused
        }
        [timed_out] = found[late[0]]
        assert timed_out.error is not None and timed_out.error.code == ErrorCode.DEADLINE_EXCEEDED
        assert await fleet.dispatches(1, timeout_s=1) == []  # still full: the waiting one waits
        await fleet.answer(placed, OutcomeStatus.COMPLETED)
        [released] = await fleet.dispatches(1)
        assert released.request_id == waiting[0] and released.attempt == 1


async def test_placements_survive_a_scheduler_restart(bus_settings: BusSettings, services: list[ServiceProc]) -> None:
    """SIGKILL the scheduler after it placed work: the new process restores the placements from
    Redis, so when their worker dies later they are still placed again, and nothing twice."""
    async with scheduler_setup(bus_settings, services, {}) as (bus, fleet, _results):
        await fleet.add("w1")
        fleet.start()
        ids = await send_routed(bus, 2)
        first = await fleet.dispatches(2, timeout_s=40)
        assert sorted(d.request_id for d in first) == sorted(ids)
        await eventually(lambda: routed_committed(bus_settings, len(ids)), timeout_s=30, interval_s=0.2)
        scheduler = services[-1]
        scheduler.kill()
        scheduler.start()
        # A sentinel, not a fixed window: once a request sent after the restart is placed, the new process
        # has restored its placements and is consuming, and nothing placed before may have come again.
        [sentinel] = await send_routed(bus, 1)
        since_restart = await fleet.dispatches(1, timeout_s=60)
        assert [d.request_id for d in since_restart] == [sentinel], "a restart places nothing twice"
        assert await fleet.dispatches(1, timeout_s=1) == [], "a restart places nothing twice"
        ids.append(sentinel)
        await fleet.add("w2")
        fleet.kill("w1")
        again = await fleet.dispatches(len(ids), timeout_s=30)
        assert sorted(d.request_id for d in again) == sorted(ids)
        assert {(d.worker_id, d.attempt) for d in again} == {("w2", 2)}


async def test_a_claim_without_its_dispatch_is_sent_after_a_restart(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    """The crash window between the Redis claim and the Dispatch: the placement is in Redis, the
    Dispatch never went out and the routed record was not committed. The next scheduler sends it."""
    from llmbus.state.store import redis_client
    from llmbus_services.scheduler.adapters.store import PlacementStore
    from llmbus_services.scheduler.core.types import Placement, SchedRequest

    request = InferenceRequest(prompt="hello " * 20, max_tokens=16, model=MODEL)
    routed = RoutedRequest(request=request, model=MODEL)
    claimed = Placement(
        request.request_id, 1, "w1", MODEL, 2, now_ms(), SchedRequest.from_routed(routed, now_ms(), 16, 64)
    )
    client = redis_client(bus_settings.redis_url)
    try:
        store = PlacementStore(client, f"{bus_settings.topic_prefix}scheduler", "crashed-instance")
        assert await store.claim(claimed)
    finally:
        await client.aclose()
    bus = await Bus.start(bus_settings, "test")
    fleet = ScriptedFleet(bus_settings, bus)
    try:
        await fleet.add("w1")
        fleet.start()
        await bus.publisher.publish(bus.topics.name(t.ROUTED), routed, key=MODEL, request_id=request.request_id)
        services.append(
            ServiceProc("llmbus_services.scheduler", bus_settings, env={"LLMBUS_SCHEDULER_TICK_MS": "100"}).start()
        )
        [sent] = await fleet.dispatches(1, timeout_s=40)
        assert (sent.request_id, sent.worker_id, sent.attempt) == (request.request_id, "w1", 1)
        assert await fleet.dispatches(1, timeout_s=2) == [], "sent once"
    finally:
        await fleet.stop()
        await bus.stop()
