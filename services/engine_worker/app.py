"""Engine-worker wiring: profile the node, choose the format, start and warm the engine, serve, drain."""

from __future__ import annotations

import asyncio
import logging
import os
import time

from prometheus_client import REGISTRY

from llmbus.bus.service import Phase, ServiceRuntime, cancelled_at_stop
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import WorkerState
from llmbus.node.gauges import register_node_metrics
from llmbus.process import started
from llmbus.settings import BusSettings
from llmbus.state.store import dispatch_markers, redis_client
from llmbus_services.engine_worker.adapters.cold_start_span import record_cold_start
from llmbus_services.engine_worker.adapters.engines.factory import build_engine
from llmbus_services.engine_worker.adapters.lifecycle import Lifecycle
from llmbus_services.engine_worker.adapters.model_fetch import PreparedModel, prepare_model
from llmbus_services.engine_worker.adapters.node.publish import NodeProfiles
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.engine import Engine
from llmbus_services.engine_worker.core.node_plan import plan_for
from llmbus_services.engine_worker.core.registry_version import registry_spec
from llmbus_services.engine_worker.core.status import cold_start_phases
from llmbus_services.engine_worker.flows import RunSite, WorkerHandlers

log = logging.getLogger(__name__)


async def build(
    runtime: ServiceRuntime, ws: WorkerSettings, start: started.Start, engine: Engine | None = None
) -> WorkerHandlers:
    """The node profiled and its plan made (the engine's format and settings), then the worker's flows
    bound to its declared subscriptions (llmbus.contract.contracts.WORKER) and its start phases."""
    settings, topics = runtime.settings, runtime.topics
    dispatch_topic = topics.dispatch(ws.worker_id)
    await runtime.ensure_topics([(dispatch_topic, t.DISPATCH_SPEC)])
    profiles = NodeProfiles(runtime.bus, lambda: runtime.read_table("nodes"), ws.node_id, ws.node_agent_max_age_s)
    profile = await profiles.refresh()  # its node agent's, else its own probe
    specs = await runtime.read_table("models")
    spec, version = registry_spec(specs, ws.model, ws.model_version)  # VersionRefused: the worker does not start
    # NoFormatFits: a clear error, the worker does not start. The engine's GPUs are the ones vLLM will see.
    plan = plan_for(
        ws.model_copy(update={"model_version": version}), profile, spec, os.environ.get("CUDA_VISIBLE_DEVICES")
    )
    # The model version's artifact, fetched and verified into the node's cache (when the settings name one):
    # a bad one ends the start here (a FAILED heartbeat, exit 3), before any engine exists.
    prepared = await prepare_model(runtime.bus, plan.settings, settings, profile, plan, start.wall_ms)
    plan = prepared.plan
    log.info("node %s (%s): %s", profile.node_id, profile.kind, plan.reason)

    redis = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
    runtime.on_stop(redis.aclose)
    if engine is None:  # an engine given is its owner's to stop
        engine = build_engine(plan.settings)
        runtime.on_stop(engine.stop)
    handlers = WorkerHandlers(runtime.bus, plan.settings, engine, dispatch_markers(redis, settings.topic_prefix))
    handlers.started_at_ms = start.wall_ms
    handlers.site = RunSite(
        worker_id=ws.worker_id,
        produced_by=runtime.bus.service,
        node_id=profile.node_id,
        gpu=profile.gpus[0].name if profile.gpus else None,
        model_version=plan.settings.model_version,
        model_format=plan.model_format,
    )
    life = Lifecycle(runtime.bus, plan.settings, handlers, dispatch_topic, plan, profiles)
    life.started_at_ms = start.wall_ms
    life.profile = profile
    register_node_metrics(REGISTRY, lambda: life.profile)  # DCGM-named gauges on this process's /metrics

    runtime.every(ws.heartbeat_interval_s, "heartbeat", life.beat, at_once=True, phase=Phase.STARTING)
    runtime.every(ws.node_profile_interval_s, "node profile", life.reprofile, phase=Phase.STARTING)
    runtime.on_start(lambda: warm_up(life, engine, start, prepared))
    runtime.subscribe(
        "dispatch",
        handlers.on_dispatch,
        names={"worker_id": ws.worker_id},
        retries=False,  # a dispatch that fails is handed back (or answered) by its handler at once
        max_in_flight=ws.max_in_flight,
        drain_grace_s=ws.drain_grace_s,
        grace_over=handlers.abort_all,  # what still runs then is aborted and handed back
    )
    # From the log's end, in the group before ready: a cancel sent before it was ready is not its.
    runtime.subscribe("control", handlers.on_control, names={"worker_id": ws.worker_id}, retries=False)
    runtime.task("engine restarts", cancelled_at_stop(life.restart_engine_on_failure))
    runtime.task("upstream watch", cancelled_at_stop(life.watch_upstream_forever))
    runtime.on_start(lambda: life.set_state(WorkerState.READY), Phase.SERVING)
    runtime.on_drain(life.drain)  # SIGTERM or a failed loop: DRAINING before the loops stop taking work
    runtime.on_stop(life.stop_handover)

    async def stopped() -> None:
        if not runtime.failed:  # a worker that failed says nothing: it is restarted
            await life.set_state(WorkerState.STOPPED)

    runtime.on_stop(stopped)
    return handlers


async def warm_up(life: Lifecycle, engine: Engine, start: started.Start, prepared: PreparedModel) -> None:
    """The engine started and warmed up; the cold start measured from the process's start, by phase."""
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
    life.cold_start_phases_s = prepared.phases(life.cold_start_phases_s)  # fetch and verify, carved out of startup
    log.info("ready after %.2fs cold start: %s", life.cold_start_s, life.cold_start_phases_s)
    phases, worker = life.cold_start_phases_s, life.settings.worker_id
    record_cold_start(start.wall_ms, life.cold_start_s, phases, worker, engine.name, engine.model, life.handlers.site)


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
    suffix = f"-{ws.worker_id}"
    await ServiceRuntime.serve(
        settings, contracts.WORKER, lambda rt: build(rt, ws, start, engine), stop, client_suffix=suffix
    )
