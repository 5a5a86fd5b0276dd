"""Engine-worker wiring and lifecycle: start → warm up → ready → (drain on SIGTERM) → stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from llmbus import topics as t
from llmbus.bus import Bus, ConsumerLoop, make_consumer, stop_consumer
from llmbus.bus.admin import ensure_topics
from llmbus.messages import WorkerState, now_ms
from llmbus.settings import BusSettings
from llmbus.state import DedupeStore, redis_client
from services.engine_worker import metrics
from services.engine_worker.config import WorkerSettings
from services.engine_worker.engines.factory import build_engine
from services.engine_worker.handlers import WorkerHandlers
from services.engine_worker.node.publish import publish_node_profile
from services.engine_worker.status import RateTracker, build_status

log = logging.getLogger(__name__)
PROCESS_STARTED = time.monotonic()  # cold start is measured from here to ready


class Lifecycle:
    """The worker's state and its heartbeat, published every heartbeat_interval_s."""

    def __init__(self, bus: Bus, settings: WorkerSettings, handlers: WorkerHandlers, dispatch_topic: str) -> None:
        self.bus, self.settings, self.handlers, self.dispatch_topic = bus, settings, handlers, dispatch_topic
        self.state = WorkerState.STARTING
        self.cold_start_s: float | None = None
        self.started_at_ms = now_ms()
        self._rates = RateTracker()

    async def beat(self) -> None:
        status = build_status(
            self.settings,
            self.handlers.engine,
            self.state,
            self.dispatch_topic,
            self._rates,
            time.monotonic(),
            cold_start_s=self.cold_start_s,
            started_at_ms=self.started_at_ms,
        )
        metrics.export(status)
        await self.bus.publisher.publish(self.bus.topics.name(t.WORKERS), status, key=self.settings.worker_id)

    async def set_state(self, state: WorkerState) -> None:
        self.state = state
        await self.beat()

    async def heartbeat_forever(self) -> None:
        while True:
            try:
                await self.beat()
            except Exception:
                log.warning("heartbeat failed", exc_info=True)
            await asyncio.sleep(self.settings.heartbeat_interval_s)

    async def restart_engine_on_failure(self) -> None:
        while True:
            await self.handlers.engine_failed.wait()
            await self.set_state(WorkerState.UNHEALTHY)
            engine = self.handlers.engine
            with contextlib.suppress(Exception):
                await engine.stop()
            await engine.start()
            await engine.warmup()
            self.handlers.engine_failed.clear()
            await self.set_state(WorkerState.READY)


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    ws = WorkerSettings()
    bus = await Bus.start(settings, t.WORKER, client_suffix=f"-{ws.worker_id}")
    topics = bus.topics
    dispatch_topic = topics.dispatch(ws.worker_id)
    await ensure_topics(settings, [(dispatch_topic, t.DISPATCH_SPEC)])
    redis = redis_client(settings.redis_url)
    engine = build_engine(ws)
    handlers = WorkerHandlers(bus, ws, engine, DedupeStore(redis, f"{settings.topic_prefix}worker"))
    life = Lifecycle(bus, ws, handlers, dispatch_topic)
    background = [asyncio.create_task(life.heartbeat_forever())]
    await publish_node_profile(bus, ws)

    await life.set_state(WorkerState.WARMING)
    await engine.start()
    await engine.warmup()
    life.cold_start_s = round(time.monotonic() - PROCESS_STARTED, 3)
    log.info("ready after %.2fs cold start", life.cold_start_s)

    dispatches = make_consumer(settings, group_id=topics.group(t.WORKER, ws.worker_id), client_id=ws.worker_id)
    controls = make_consumer(
        settings,
        topics.name(t.CONTROL),
        group_id=topics.group(t.WORKER, f"{ws.worker_id}.control"),
        client_id=f"{ws.worker_id}-control",
        from_beginning=False,
    )
    dispatch_loop = ConsumerLoop(
        dispatches,
        handlers.on_dispatch,
        bus.dead_letter,
        settings,
        service=t.WORKER,
        max_in_flight=ws.max_in_flight,
        drain_grace_s=ws.drain_grace_s + 10,
    )
    control_loop = ConsumerLoop(
        controls, handlers.on_control, bus.dead_letter, settings, service=t.WORKER, max_in_flight=16
    )
    dispatches.subscribe([dispatch_topic], listener=dispatch_loop.rebalance_listener())
    for consumer in (dispatches, controls):
        await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
    loops_stop = asyncio.Event()
    loops = [asyncio.create_task(dispatch_loop.run(loops_stop)), asyncio.create_task(control_loop.run(stop))]
    background.append(asyncio.create_task(life.restart_engine_on_failure()))
    await life.set_state(WorkerState.READY)
    try:
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([stopped, loops[0]], return_when=asyncio.FIRST_COMPLETED)
        await _drain(life, handlers, dispatch_loop, loops_stop, ws.drain_grace_s)
        await asyncio.gather(*loops, return_exceptions=True)
        await life.set_state(WorkerState.STOPPED)
    finally:
        for task in background:
            task.cancel()
        for consumer in (dispatches, controls):
            await stop_consumer(consumer, settings.stop_timeout_s)
        with contextlib.suppress(Exception):
            await engine.stop()
        with contextlib.suppress(Exception):
            await redis.aclose()
        await bus.stop()


async def _drain(
    life: Lifecycle, handlers: WorkerHandlers, loop: ConsumerLoop, loops_stop: asyncio.Event, grace_s: float
) -> None:
    """Stop taking work, let in-flight requests finish for grace_s, hand back the rest."""
    handlers.draining = True
    await life.set_state(WorkerState.DRAINING)
    loops_stop.set()
    deadline = time.monotonic() + grace_s
    while loop.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if loop.in_flight:
        log.warning("grace period over: handing back %d requests", loop.in_flight)
        await handlers.abort_all()
