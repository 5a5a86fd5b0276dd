"""Engine-worker wiring: profile the node, choose the format, start and warm the engine, serve."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from prometheus_client import REGISTRY

from llmbus.bus import Bus, ConsumerLoop, make_consumer, stop_consumer
from llmbus.bus.admin import ensure_topics
from llmbus.bus.catch_up import wait_assigned
from llmbus.bus.runtime import run_until_stopped
from llmbus.bus.tables import read_table
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import ModelSpec, WorkerState
from llmbus.process import started
from llmbus.settings import BusSettings
from llmbus.state.store import dispatch_markers, redis_client
from llmbus_services.engine_worker.adapters.engines.factory import build_engine
from llmbus_services.engine_worker.adapters.lifecycle import Lifecycle
from llmbus_services.engine_worker.adapters.node.metrics import register_node_metrics
from llmbus_services.engine_worker.adapters.node.publish import profile_and_publish
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.engine import Engine
from llmbus_services.engine_worker.core.node_plan import plan_for
from llmbus_services.engine_worker.core.status import cold_start_phases
from llmbus_services.engine_worker.handlers import RunSite, WorkerHandlers

log = logging.getLogger(__name__)


async def main(
    settings: BusSettings,
    stop: asyncio.Event,
    engine: Engine | None = None,
    worker_settings: WorkerSettings | None = None,
) -> None:
    """Serve until `stop`. `engine`: one already built (and maybe started) by the caller, used instead of
    the one the settings describe and left running at the end (its owner stops it): an embedding process
    or a test that shares one vLLM engine between several workers' lifetimes."""
    # Cold start counts from the process's start to ready; heartbeats say started_at_ms + cold_start_s =
    # ready, so both count from that instant. Dispatches sent before it went to an earlier process of this
    # worker id, which may have begun them (WorkerHandlers hands them back). A worker embedded in a
    # running process (`engine` given) starts at this call.
    start = started.now() if engine is not None else started.of_this_process()
    ws = worker_settings or WorkerSettings()
    bus = await Bus.start(settings, t.WORKER, client_suffix=f"-{ws.worker_id}")
    topics = bus.topics
    dispatch_topic = topics.dispatch(ws.worker_id)
    await ensure_topics(settings, [(dispatch_topic, t.DISPATCH_SPEC)])
    profile = await profile_and_publish(bus, ws.node_id)
    specs = await read_table(settings, topics.name(t.MODELS), ModelSpec, timeout_s=5)
    plan = plan_for(ws, profile, specs.get(ws.model))  # NoFormatFits: a clear error, the worker does not start
    log.info("node %s (%s): %s", profile.node_id, profile.kind, plan.reason)

    redis = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
    owns_engine = engine is None
    engine = engine or build_engine(plan.settings)
    handlers = WorkerHandlers(bus, plan.settings, engine, dispatch_markers(redis, settings.topic_prefix))
    handlers.started_at_ms = start.wall_ms
    handlers.site = RunSite(
        node_id=profile.node_id,
        gpu=profile.gpus[0].name if profile.gpus else None,
        model_version=plan.settings.model_version,
        model_format=plan.model_format,
    )
    life = Lifecycle(bus, plan.settings, handlers, dispatch_topic, plan)
    life.started_at_ms = start.wall_ms
    life.profile = profile
    register_node_metrics(REGISTRY, lambda: life.profile)  # DCGM-named gauges on this process's /metrics
    background = [asyncio.create_task(life.heartbeat_forever()), asyncio.create_task(life.reprofile_forever())]

    await life.set_state(WorkerState.WARMING)
    engine_starts = time.monotonic()
    await engine.start()
    warmup_starts = time.monotonic()
    await engine.warmup()
    ready = time.monotonic()
    life.cold_start_s = round(ready - start.monotonic, 3)
    life.cold_start_phases_s = cold_start_phases(
        engine_starts - start.monotonic,
        warmup_starts - engine_starts,
        ready - warmup_starts,
        getattr(engine, "cold_start_phases_s", {}),  # only vllm splits its start
    )
    log.info("ready after %.2fs cold start: %s", life.cold_start_s, life.cold_start_phases_s)

    declared = contracts.WORKER
    dispatches = make_consumer(
        settings, group_id=declared.group_id("dispatch", topics, worker_id=ws.worker_id), client_id=ws.worker_id
    )
    controls = make_consumer(
        settings,
        topics.name(t.CONTROL),
        group_id=declared.group_id("control", topics, worker_id=ws.worker_id),
        client_id=f"{ws.worker_id}-control",
        from_beginning=declared.subscription("control").from_earliest,
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
    # Control starts at the log end: be in the group before saying ready, or an early cancel is skipped.
    await wait_assigned(controls, settings.admin_timeout_s)
    loops_stop = asyncio.Event()

    async def drain_on_stop() -> None:
        # SIGTERM, or a loop that failed (run_until_stopped sets `stop`): drain, then the dispatch loop ends.
        await stop.wait()
        await life.drain(dispatch_loop, loops_stop)

    tasks = [
        asyncio.create_task(dispatch_loop.run(loops_stop)),
        asyncio.create_task(control_loop.run(stop)),
        asyncio.create_task(drain_on_stop()),
    ]
    background.append(asyncio.create_task(life.restart_engine_on_failure()))
    background.append(asyncio.create_task(life.watch_upstream_forever()))
    await life.set_state(WorkerState.READY)
    try:
        # A stalled or failed loop raises out of here: the worker exits non-zero and is restarted.
        await run_until_stopped(tasks, stop)
        await life.set_state(WorkerState.STOPPED)
    finally:
        for task in background:
            task.cancel()
        for consumer in (dispatches, controls):
            await stop_consumer(consumer, settings.stop_timeout_s)
        if owns_engine:
            with contextlib.suppress(Exception):
                await engine.stop()
        with contextlib.suppress(Exception):
            await redis.aclose()
        await bus.stop()
