"""A max_attempts error whose attempts are legs of the answer is not sent: the request goes on.

Found by `make reliability` (sigkill_sampled_workers, long: four SIGKILLs 7.5 s apart): 11-46 of 3000 answers
ended `max_attempts` although each of their three attempts had streamed text the next one continued. Legs
are bounded by the answer's `migration_limit` (4 unless the request says), which its next worker enforces;
`max_attempts` (3) ended them first. Before a max_attempts error goes out, the scheduler reads the request's
reply topic (the real broker here, with chunks as workers write them) and does not count the attempts whose
text the answer so far continues.

Pass criterion, fixed before the run: with three continued legs on the reply topic, attempt 4 is dispatched
and no result published; with no chunk, or with text the next attempt would start again (chunks with a gap),
the max_attempts error goes out and nothing is dispatched."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis
from aiokafka import AIOKafkaProducer

from llmbus.contract.messages import (
    ContinuedFrom,
    Dispatch,
    EarlierAttempt,
    ErrorCode,
    InferenceRequest,
    InferenceResult,
    RoutedRequest,
    TokenChunk,
    now_ms,
)
from llmbus.contract.topics import Topics
from llmbus.settings import BusSettings
from llmbus.state.store import dispatch_markers
from llmbus_services.scheduler.adapters.store import PlacementStore
from llmbus_services.scheduler.app import build_core
from llmbus_services.scheduler.config import SchedulerSettings
from llmbus_services.scheduler.core.types import Placement, SchedRequest
from llmbus_services.scheduler.flows import SchedulerHandlers
from tests.integration.test_scheduler_handler_faults import FakeBus, FlakyPublisher, heartbeat
from tests.support import redis_keys

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


@pytest.fixture
async def handlers(client: redis.Redis, bus_settings: BusSettings) -> AsyncIterator[SchedulerHandlers]:
    namespace = bus_settings.topic_prefix
    settings = SchedulerSettings(instance_id="s1", heartbeat_stale_s=60, max_attempts=3)
    bus = FakeBus(FlakyPublisher(), topics=Topics(namespace), settings=bus_settings)
    store = PlacementStore(client, f"{namespace}scheduler", "s1")
    yield SchedulerHandlers(bus, settings, build_core(settings), store, dispatch_markers(client, namespace, 3600))  # type: ignore[arg-type]
    keys = await redis_keys(client, f"llmbus:{namespace}*")
    if keys:
        await client.delete(*keys)


async def write_chunks(settings: BusSettings, chunks: list[TokenChunk]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await asyncio.wait_for(producer.start(), 30)
    try:
        topic = Topics(settings.topic_prefix).name("llm.tokens")
        for chunk in chunks:
            await asyncio.wait_for(producer.send_and_wait(topic, chunk.to_bytes(), key=chunk.request_id.encode()), 30)
    finally:
        await producer.stop()


def legs(request_id: str) -> list[TokenChunk]:
    """Attempt 1 streamed seq 0-2, attempt 2 continued it at 3-4, attempt 3 at 5: one answer, three legs."""

    def chunk(seq: int, attempt: int, continues: ContinuedFrom | None = None) -> TokenChunk:
        return TokenChunk(
            request_id=request_id,
            tenant="default",
            seq=seq,
            delta=f"w{seq} ",
            tokens=1,
            attempt=attempt,
            model="m",
            continues=continues,
        )

    return [
        chunk(0, 1), chunk(1, 1), chunk(2, 1),
        chunk(3, 2, ContinuedFrom(attempt=1, seq=3)), chunk(4, 2),
        chunk(5, 3, ContinuedFrom(attempt=2, seq=5)),
    ]  # fmt: skip


async def third_attempt_lost(handlers: SchedulerHandlers, request_id: str) -> list[object]:
    """Attempts 1-3 each lost with its worker (w1-w3); w4 is live. What the scheduler publishes after."""
    await heartbeat(handlers, "w4")
    routed = RoutedRequest(request=InferenceRequest(request_id=request_id, prompt="hi", max_tokens=64), model="m")
    routed.received_at_ms = now_ms()
    request = SchedRequest.from_routed(routed, now_ms(), 16, 0)
    request.attempt, request.excluded_workers = 3, {"w1", "w2", "w3"}
    request.earlier = [EarlierAttempt(attempt=n, worker_id=f"w{n}", ended=ErrorCode.WORKER_LOST) for n in (1, 2)]
    lost = Placement(request_id, 3, "w3", "m", 1, now_ms(), request)
    [final] = handlers.core._follow(handlers.core.recovery.retry(lost, ErrorCode.WORKER_LOST), now_ms())
    async with handlers._lock:
        await handlers._publish([final])
    while handlers._later:  # the error's task, then the Dispatch's it starts
        await asyncio.wait_for(asyncio.gather(*handlers._later), 30)
    return handlers.bus.publisher.sent  # type: ignore[attr-defined, no-any-return]


async def test_three_legs_of_one_answer_leave_it_attempts_it_goes_on_as_attempt_4(
    handlers: SchedulerHandlers, bus_settings: BusSettings
) -> None:
    request_id = uuid.uuid4().hex
    await write_chunks(bus_settings, legs(request_id))
    sent = [value for _, value in await third_attempt_lost(handlers, request_id)]
    assert not [v for v in sent if isinstance(v, InferenceResult)]
    [dispatch] = [v for v in sent if isinstance(v, Dispatch)]
    assert (dispatch.attempt, dispatch.worker_id) == (4, "w4")
    assert [e.attempt for e in dispatch.earlier] == [1, 2, 3]


@pytest.mark.parametrize("chunks", ["none", "gap"])
async def test_attempts_that_left_no_text_to_continue_end_with_max_attempts(
    handlers: SchedulerHandlers, bus_settings: BusSettings, chunks: str
) -> None:
    request_id = uuid.uuid4().hex
    if chunks == "gap":  # seq 1 missing: the next attempt would start the answer again
        await write_chunks(bus_settings, [c for c in legs(request_id) if c.seq != 1])
    sent = [value for _, value in await third_attempt_lost(handlers, request_id)]
    assert not [v for v in sent if isinstance(v, Dispatch)]
    [result] = [v for v in sent if isinstance(v, InferenceResult)]
    assert result.error is not None and result.error.code == ErrorCode.MAX_ATTEMPTS
