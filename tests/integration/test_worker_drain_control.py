"""Control(drain) takes a worker out of placement (a sim worker and the scheduler as processes, real broker
and Redis).

The worker used to refuse its dispatches while heartbeating READY: the scheduler kept placing on it
and every placement burnt one of the request's attempts (handed back, placed again, handed back).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmbus.bus import Bus, decode
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Control,
    ControlAction,
    ErrorCode,
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    RoutedRequest,
    WorkerState,
    WorkerStatus,
)
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

MODEL = "sim-llama-8b"
WORKER = "w-drained"


async def worker_states(tail: TopicTail, count: int, timeout_s: float) -> list[WorkerState]:
    """The states of the worker's next `count` heartbeats."""
    states: list[WorkerState] = []
    async for record in tail.records(timeout_s):
        status = decode(record, WorkerStatus)  # type: ignore[arg-type]
        if status.worker_id == WORKER:
            states.append(status.state)
            if len(states) == count:
                break
    return states


async def first_result(tail: TopicTail, request_id: str, timeout_s: float) -> InferenceResult:
    async for record in tail.records(timeout_s):
        result = decode(record, InferenceResult)  # type: ignore[arg-type]
        if result.request_id == request_id:
            return result
    raise TimeoutError(f"no result for {request_id}")


async def test_a_drained_worker_heartbeats_draining_and_gets_no_more_dispatches(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    services.append(
        ServiceProc(
            "llmbus_services.scheduler", bus_settings, {"LLMBUS_SCHEDULER_NO_WORKER_TIMEOUT_S": "3"}, tmp_path
        ).start()
    )
    worker_env = {"LLMBUS_WORKER_WORKER_ID": WORKER, "LLMBUS_WORKER_HEARTBEAT_INTERVAL_S": "0.2"}
    services.append(ServiceProc("llmbus_services.engine_worker", bus_settings, worker_env, tmp_path, WORKER).start())
    await wait_workers_ready(bus_settings, {WORKER})
    topics = t.Topics(bus_settings.topic_prefix)
    bus = await Bus.start(bus_settings, t.CLIENT)
    heartbeats = await TopicTail(bus_settings, topics.name(t.WORKERS)).start()
    dispatches = await TopicTail(bus_settings, topics.dispatch(WORKER)).start()
    results = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    try:
        drain = Control(action=ControlAction.DRAIN, target_id=WORKER, reason="test")
        await bus.publisher.publish(topics.name(t.CONTROL), drain, key=WORKER)
        # Beats already on their way may say READY; within a few more it says DRAINING.
        states = await worker_states(heartbeats, 15, timeout_s=20)
        assert WorkerState.DRAINING in states, states
        assert states[states.index(WorkerState.DRAINING) :] == [WorkerState.DRAINING] * (
            len(states) - states.index(WorkerState.DRAINING)
        )
        assert await worker_states(heartbeats, 3, timeout_s=20) == [WorkerState.DRAINING] * 3, "it stays drained"

        request = InferenceRequest(request_id="r-after-drain", prompt="hi", max_tokens=4)
        await bus.publisher.publish(topics.name(t.ROUTED), RoutedRequest(request=request, model=MODEL), key=MODEL)
        result = await first_result(results, request.request_id, timeout_s=30)
        assert result.status == ResultStatus.ERROR and result.error is not None
        # Waited for a worker the fleet never offered: not max_attempts, burnt on the drained one.
        waited = (ErrorCode.OVER_CAPACITY, ErrorCode.DEADLINE_EXCEEDED, ErrorCode.MODEL_UNAVAILABLE)
        assert result.error.code in waited, result.error
        placed = [r async for r in dispatches.records(1) if r.key == request.request_id.encode()]  # type: ignore[attr-defined]
        assert placed == []
    finally:
        for tail in (heartbeats, dispatches, results):
            await tail.stop()
        await bus.stop()
