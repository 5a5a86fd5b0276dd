"""The engine-worker's own wiring (app.build: node profile, plan, engine warmed up, READY) in memory and on the
real broker: a dispatch becomes chunks on its reply topic, one result and one outcome."""

from __future__ import annotations

import uuid

import pytest

from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Dispatch,
    DispatchOutcome,
    InferenceRequest,
    InferenceResult,
    OutcomeStatus,
    ResultStatus,
    RoutedRequest,
    TokenChunk,
    WorkerState,
    WorkerStatus,
)
from llmbus.process import started
from llmbus_services.engine_worker.app import build
from llmbus_services.engine_worker.config import WorkerSettings
from tests.fixtures.buses import EitherBus

pytestmark = pytest.mark.redis


async def test_a_dispatch_streams_its_chunks_and_ends_in_one_result_and_one_outcome(on_bus: EitherBus) -> None:
    topics = on_bus.topics
    worker_id = f"w-{uuid.uuid4().hex[:6]}"
    ws = WorkerSettings(worker_id=worker_id, engine="sim", model="sim-llama-8b", sim_speedup=50)  # type: ignore[call-arg]
    runtime = await on_bus.runtime(contracts.WORKER, client_suffix=f"-{worker_id}")
    await build(runtime, ws, started.now())
    await on_bus.start(runtime)
    beats = await on_bus.published(
        topics.name(t.WORKERS), WorkerStatus, until=lambda found: any(s.state == WorkerState.READY for s in found)
    )
    assert [s.state for s in beats][-1] == WorkerState.READY and beats[-1].cold_start_s is not None

    request = InferenceRequest(request_id="r1", tenant="acme", prompt="hello there", max_tokens=6)
    dispatch = Dispatch(routed=RoutedRequest(request=request, model="sim-llama-8b"), worker_id=worker_id, attempt=1)
    await on_bus.send(topics.dispatch(worker_id), dispatch, key="r1")
    [result] = await on_bus.published(topics.name(t.RESULTS), InferenceResult, until=lambda found: len(found) >= 1)
    assert result.status == ResultStatus.OK and result.worker_id == worker_id and result.usage.completion_tokens == 6
    chunks = await on_bus.published(topics.name(t.TOKENS), TokenChunk, until=lambda found: any(c.final for c in found))
    assert "".join(c.delta for c in chunks) == result.text and [c.seq for c in chunks] == list(range(len(chunks)))
    [outcome] = await on_bus.published(topics.name(t.OUTCOMES), DispatchOutcome, until=lambda found: len(found) >= 1)
    assert (outcome.request_id, outcome.attempt, outcome.status) == ("r1", 1, OutcomeStatus.COMPLETED)
    assert not runtime.contract.undeclared(topics, runtime.publisher.topics_written)
