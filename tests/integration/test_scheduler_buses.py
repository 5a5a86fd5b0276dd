"""The scheduler's own wiring (app.build) in memory and on the real broker: a worker heard from, a routed
request placed on it (claimed, its Dispatch on the worker's topic), the outcome releasing the placement."""

from __future__ import annotations

import uuid

import pytest

from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Dispatch,
    DispatchOutcome,
    InferenceRequest,
    OutcomeStatus,
    RoutedRequest,
    WorkerState,
    WorkerStatus,
)
from llmbus_services.scheduler.app import build
from llmbus_services.scheduler.config import SchedulerSettings
from tests.fixtures.buses import EitherBus
from tests.support import until

pytestmark = pytest.mark.redis


async def test_a_routed_request_is_placed_on_the_worker_heard_from_and_released_by_its_outcome(
    on_bus: EitherBus,
) -> None:
    topics = on_bus.topics
    worker_topic = topics.dispatch("w1")
    await on_bus.create_topic(worker_topic, t.DISPATCH_SPEC)
    runtime = await on_bus.runtime(contracts.SCHEDULER)
    handlers = build(runtime, SchedulerSettings(instance_id=f"s-{uuid.uuid4().hex[:6]}"))
    await on_bus.start(runtime)
    status = WorkerStatus(
        worker_id="w1",
        node_id="n1",
        state=WorkerState.READY,
        engine="sim",
        models=["m"],
        max_model_len=8192,
        kv_blocks_total=1000,
        kv_blocks_free=1000,
        dispatch_topic=worker_topic,
    )
    await on_bus.send(topics.name(t.WORKERS), status, key="w1")
    await until(lambda: "w1" in handlers.core.fleet.workers, timeout_s=30)

    request = InferenceRequest(request_id="r1", tenant="acme", prompt="hello", max_tokens=4)
    await on_bus.send(topics.name(t.ROUTED), RoutedRequest(request=request, model="m"), key="m")
    [dispatch] = await on_bus.published(worker_topic, Dispatch, until=lambda found: len(found) >= 1)
    assert (dispatch.request_id, dispatch.worker_id, dispatch.attempt) == ("r1", "w1", 1)
    assert handlers.core.fleet.placement_of(request.request_key) is not None

    outcome = DispatchOutcome(
        request_id="r1", tenant="acme", worker_id="w1", attempt=1, status=OutcomeStatus.COMPLETED, model="m"
    )
    await on_bus.send(topics.name(t.OUTCOMES), outcome, key="r1")
    await until(lambda: handlers.core.fleet.placement_of(request.request_key) is None, timeout_s=30)
    assert not runtime.contract.undeclared(topics, runtime.publisher.topics_written)
