"""Worker handler decisions with in-memory fakes (the Kafka paths are in tests/integration)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiokafka.structs import ConsumerRecord

from llmbus.contract.messages import (
    Dispatch,
    DispatchOutcome,
    ErrorCode,
    InferenceRequest,
    OutcomeStatus,
    RoutedRequest,
)
from llmbus.contract.topics import Topics
from llmbus.settings import BusSettings
from llmbus_services.engine_worker.adapters.engines.sim.engine import SimConfig, SimEngine
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.flows import WorkerHandlers


@dataclass
class RecordingPublisher:
    sent: list[tuple[str, object]] = field(default_factory=list)

    async def publish(self, topic: str, value: object, **_: object) -> None:
        self.sent.append((topic, value))


@dataclass
class FakeBus:
    publisher: RecordingPublisher
    topics: Topics = field(default_factory=lambda: Topics("x."))
    service: str = "engine-worker"
    settings: BusSettings = field(default_factory=BusSettings)


class BrokenRedis:
    async def superseded(self, *_: object) -> bool:
        raise ConnectionError("redis is down")


def dispatch_record() -> ConsumerRecord:
    request = InferenceRequest(prompt="hello", max_tokens=4)
    dispatch = Dispatch(routed=RoutedRequest(request=request, model="sim-llama-8b"), worker_id="w1")
    raw = dispatch.to_bytes()
    return ConsumerRecord("x.llm.dispatch.w1", 0, 0, 0, 0, None, raw, None, 0, len(raw), [])


async def test_a_worker_side_failure_is_reported_as_retryable_not_swallowed() -> None:
    publisher = RecordingPublisher()
    handlers = WorkerHandlers(
        FakeBus(publisher),
        WorkerSettings(worker_id="w1"),  # type: ignore[arg-type]
        SimEngine(SimConfig(speedup=0)),
        BrokenRedis(),
    )  # type: ignore[arg-type]
    await handlers.on_dispatch(dispatch_record())
    [(topic, outcome)] = publisher.sent
    assert topic == "x.llm.outcomes" and isinstance(outcome, DispatchOutcome)
    assert outcome.status == OutcomeStatus.RETRYABLE and outcome.error is not None
    assert outcome.error.code == ErrorCode.WORKER_ERROR and "redis is down" in outcome.error.message


class MarkedRedis:
    def __init__(self, fence: dict[str, int]) -> None:
        self.fence = fence  # request id → highest attempt placed
        self.asked: list[tuple[str, int]] = []

    async def superseded(self, request_id: str, attempt: int) -> bool:
        self.asked.append((request_id, attempt))
        return self.fence.get(request_id, 0) > attempt


async def test_a_superseded_attempt_is_not_run_again() -> None:
    publisher = RecordingPublisher()
    record = dispatch_record()
    dispatch = Dispatch.model_validate_json(record.value)
    markers = MarkedRedis({dispatch.request_key: 2})
    handlers = WorkerHandlers(
        FakeBus(publisher),
        WorkerSettings(worker_id="w1"),  # type: ignore[arg-type]
        SimEngine(SimConfig(speedup=0)),
        markers,
    )  # type: ignore[arg-type]
    await handlers.on_dispatch(record)
    assert (dispatch.request_key, 1) in markers.asked
    [(_, outcome)] = publisher.sent  # no chunks, no result: only the outcome
    assert isinstance(outcome, DispatchOutcome) and outcome.status == OutcomeStatus.DUPLICATE
