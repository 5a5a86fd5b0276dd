"""The runtime's life cycle without a broker: start phases in order, ready last, a failed phase or task
stopping everything started, drain before the tasks end, clean-ups last first (llmbus.bus.service).

A runtime with no subscriptions opens no consumer, so its phases, timers and tasks run here as they do
in a service; what its loops do with records is tested against the real broker
(tests/integration/test_bus_service.py)."""

from __future__ import annotations

import asyncio

import pytest

from llmbus.bus.memory import MemoryBus, MemoryLog, MemoryPublisher
from llmbus.bus.runtime import Bus
from llmbus.bus.service import Phase, ServiceRuntime, cancelled_at_stop
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import Control, ControlAction, CostRecord, ScaleDecision, now_ms
from llmbus.settings import BusSettings

SETTINGS = BusSettings(topic_prefix="unit.", stop_timeout_s=1)


class Closing(MemoryPublisher):
    closed = False

    async def close(self, timeout_s: float) -> None:
        self.closed = True


def bare(contract: contracts.Contract = contracts.AUTOSCALER) -> tuple[ServiceRuntime, Closing]:
    """A runtime with nothing subscribed: no consumer, everything else as in a service."""
    publisher = Closing(MemoryLog(), contract.service)
    return ServiceRuntime(Bus(SETTINGS, contract.service, t.Topics("unit."), publisher), contract), publisher


def recorder(events: list[str], name: str):  # type: ignore[no-untyped-def]
    async def job() -> None:
        events.append(name)

    return job


async def test_the_phases_run_in_order_and_ready_comes_last() -> None:
    runtime, _ = bare()
    events: list[str] = []

    async def heartbeat(stop: asyncio.Event) -> None:
        events.append("heartbeat")
        await stop.wait()

    runtime.task("heartbeat", heartbeat, phase=Phase.STARTING)
    runtime.on_start(recorder(events, "serving"), Phase.SERVING)
    runtime.on_start(recorder(events, "tables"))
    runtime.on_start(recorder(events, "caught up"), Phase.FOLLOWED)
    runtime.every(3600, "timer", recorder(events, "timer"), at_once=True)
    await runtime.start()
    try:
        assert events == ["heartbeat", "tables", "caught up", "timer", "serving"]
        assert runtime.caught_up.is_set() and runtime.ready.is_set() and not runtime.failed
    finally:
        await runtime.stop()


async def test_a_phase_that_fails_stops_everything_started_and_raises() -> None:
    runtime, publisher = bare()
    events: list[str] = []

    async def heartbeat(stop: asyncio.Event) -> None:
        await stop.wait()
        events.append("heartbeat stopped")

    async def warm_up() -> None:
        raise RuntimeError("the engine did not start")

    runtime.task("heartbeat", heartbeat, phase=Phase.STARTING)
    runtime.on_start(warm_up)
    runtime.on_start(recorder(events, "never"), Phase.SERVING)
    runtime.on_stop(recorder(events, "redis closed"))
    runtime.on_stop(recorder(events, "engine stopped"))
    with pytest.raises(RuntimeError, match="did not start"):
        await runtime.start()
    assert events == ["heartbeat stopped", "engine stopped", "redis closed"]
    assert publisher.closed and runtime.failed and not runtime.ready.is_set()
    await runtime.stop()  # again: nothing twice
    assert events.count("redis closed") == 1


async def test_a_task_that_fails_stops_the_service_after_the_drain_and_its_error_is_raised() -> None:
    runtime, publisher = bare()
    events: list[str] = []

    async def broken(stop: asyncio.Event) -> None:
        await asyncio.sleep(0.01)
        raise ValueError("a bug")

    async def other(stop: asyncio.Event) -> None:
        await stop.wait()
        await asyncio.sleep(0.05)  # its own drain
        events.append("other ended")

    runtime.task("broken", broken)
    runtime.task("other", other)
    runtime.on_drain(recorder(events, "draining"))
    runtime.on_stop(recorder(events, "cleaned"))
    with pytest.raises(ValueError, match="a bug"):
        await asyncio.wait_for(runtime.run(asyncio.Event()), 10)
    assert events == ["draining", "other ended", "cleaned"] and publisher.closed and runtime.failed


async def test_stop_drains_first_then_ends_the_tasks_then_cleans_up() -> None:
    runtime, _ = bare()
    events: list[str] = []

    async def server(stop: asyncio.Event) -> None:
        await stop.wait()
        events.append("server ended")

    async def forever() -> None:
        await asyncio.Event().wait()  # knows no stop of its own

    runtime.task("server", server)
    runtime.task("restarts", cancelled_at_stop(forever))
    runtime.on_drain(recorder(events, "draining"))
    runtime.on_stop(recorder(events, "cleaned"))
    stop = asyncio.Event()
    running = asyncio.create_task(runtime.run(stop))
    await asyncio.wait_for(runtime.ready.wait(), 10)
    stop.set()
    await asyncio.wait_for(running, 5)  # the endless one is cancelled at the stop, not waited for
    assert events == ["draining", "server ended", "cleaned"] and not runtime.failed


async def test_a_build_that_fails_closes_what_was_connected(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime, publisher = bare()

    async def connected(settings: BusSettings, service: str, client_suffix: str = "") -> Bus:
        return runtime.bus

    monkeypatch.setattr(Bus, "start", staticmethod(connected))

    def build(runtime: ServiceRuntime) -> None:
        raise ValueError("no format fits")

    with pytest.raises(ValueError, match="no format fits"):
        await ServiceRuntime.serve(SETTINGS, contracts.AUTOSCALER, build, asyncio.Event())
    assert publisher.closed


async def test_in_memory_the_start_jobs_run_and_records_reach_each_subscriptions_error_path() -> None:
    bus = MemoryBus(SETTINGS)
    runtime = bus.runtime(contracts.SCHEDULER)
    handled: list[str] = []
    failed: list[str] = []

    async def on_control(record: object) -> None:
        raise RuntimeError("refused")

    async def on_error(record: object, exc: Exception) -> None:
        failed.append(str(exc))

    runtime.subscribe("control", on_control, on_error=on_error, retries=False)
    runtime.on_start(recorder(handled, "restored"))
    await runtime.start()
    await bus.send(bus.topics.name(t.CONTROL), Control(target_id="r", action=ControlAction.CANCEL), key="r")
    assert handled == ["restored"] and failed == ["refused"] and runtime.ready.is_set()
    assert bus.published(bus.topics.name(t.DLQ), Control) == []  # its own error path, not the DLQ
    await runtime.stop()


async def test_a_start_up_table_in_memory_is_the_logs_latest_value_per_key() -> None:
    bus = MemoryBus(SETTINGS)
    runtime = bus.runtime(contracts.AUTOSCALER)
    scaling = bus.topics.name(t.SCALING)

    def decision(pool: str, replicas: int) -> ScaleDecision:
        return ScaleDecision(pool=pool, current_replicas=0, desired_replicas=replicas, reason="r", policy="p")

    for replicas in (1, 2):
        await bus.send(scaling, decision("p", replicas), key="p")
    await bus.send(scaling, decision("q", 1), key="q")
    await bus.send(scaling, None, key="q")
    table = await runtime.read_table("scaling")
    assert {pool: d.desired_replicas for pool, d in table.items()} == {"p": 2}


async def test_a_start_up_read_since_a_time_in_memory_is_what_was_written_from_then_on() -> None:
    bus = MemoryBus(SETTINGS)
    runtime = bus.runtime(contracts.COST)
    costs = bus.topics.name(t.COSTS)
    await bus.send(costs, CostRecord(request_id="before", tenant="t", model="m", cost_usd=0.0), key="before")
    since_ms = now_ms() + 1
    await asyncio.sleep(0.01)
    await bus.send(costs, CostRecord(request_id="after", tenant="t", model="m", cost_usd=0.0), key="after")
    assert [r.request_id for r in await runtime.read_since("billed", since_ms, timeout_s=1)] == ["after"]
    with pytest.raises(ValueError, match="not a start-up read"):
        await runtime.read_since("results", since_ms, timeout_s=1)
