"""A worker SIGKILLed and started again under its id serves at once: it is the static member of its groups.

Found by `make reliability` (sigkill_sampled_workers, four SIGKILLs 7.5 s apart, each worker back 2 s
later): each restarted worker logged its dispatch partition assigned 6.3-7.0 s after its cold start
ended. Its groups are its own, but the dead process was still their member until its session timed out,
so for 8-9 s of every 7.5 s one of the three workers read nothing, and retries queued on the next victim.

Here the worker runs with 30 s sessions, so a dynamic member would wait for the dead one's session to
end. Pass criterion, fixed before the run: the new process says `ready` within 15 s of its start, and a
Dispatch sent as soon as it does is streamed from within 5 s (it says ready only once its dispatch
partition is assigned)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaProducer

from llmbus.bus import decode
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import Dispatch, InferenceRequest, RoutedRequest, TokenChunk, WorkerState, WorkerStatus
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready

pytestmark = [pytest.mark.kafka, pytest.mark.redis]
SESSION_MS = 30_000


async def ready_after(tail: TopicTail, worker_id: str, timeout_s: float) -> float:
    """When (monotonic) `worker_id` next says ready on llm.workers."""
    async for record in tail.records(timeout_s):
        status = decode(record, WorkerStatus)
        if status.worker_id == worker_id and status.state == WorkerState.READY:
            return time.monotonic()
    raise TimeoutError(f"{worker_id} not ready within {timeout_s}s")


async def first_chunk(tail: TopicTail, request_id: str, timeout_s: float) -> float:
    async for record in tail.records(timeout_s):
        if decode(record, TokenChunk).request_id == request_id:
            return time.monotonic()
    raise TimeoutError(f"no chunk of {request_id} within {timeout_s}s")


async def test_a_worker_started_again_after_a_sigkill_is_ready_and_reads_its_dispatches_at_once(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    env = {
        "LLMBUS_WORKER_WORKER_ID": "w1",
        "LLMBUS_WORKER_SIM_SPEEDUP": "50",
        "LLMBUS_SESSION_TIMEOUT_MS": str(SESSION_MS),
    }
    worker = ServiceProc("llmbus_services.engine_worker", bus_settings, name="w1", env=env).start()
    services.append(worker)
    await wait_workers_ready(bus_settings, {"w1"})
    worker.kill()
    heartbeats = await TopicTail(bus_settings, topics.name(t.WORKERS)).start()
    tokens = await TopicTail(bus_settings, topics.name(t.TOKENS)).start()
    producer = AIOKafkaProducer(bootstrap_servers=bus_settings.kafka_bootstrap, acks="all")
    await asyncio.wait_for(producer.start(), 30)
    try:
        started = time.monotonic()
        worker.start()
        ready = await ready_after(heartbeats, "w1", 60)
        request_id = uuid.uuid4().hex
        request = InferenceRequest(request_id=request_id, tenant="acme", prompt="hello", max_tokens=8)
        dispatch = Dispatch(routed=RoutedRequest(request=request, model="sim-llama-8b"), worker_id="w1", attempt=1)
        sent = time.monotonic()
        await asyncio.wait_for(
            producer.send_and_wait(topics.dispatch("w1"), dispatch.to_bytes(), key=request_id.encode()), 30
        )
        streamed = await first_chunk(tokens, request_id, 30)
    finally:
        await producer.stop()
        await heartbeats.stop()
        await tokens.stop()
    assert ready - started < 15, f"ready {ready - started:.1f}s after its start (sessions {SESSION_MS / 1000:.0f}s)"
    assert streamed - sent < 5, f"first chunk {streamed - sent:.1f}s after the Dispatch"
