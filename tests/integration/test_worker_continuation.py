"""A cut answer continued by the next attempt (docs/delivery.md, "Continuation across legs"): two sim workers'
dispatch flows on the real broker and Redis, sampled generation (temperature > 0, no seed: each run draws its
own answer, so a restart could never line up with what the client was sent).

Attempt 1 streams part of an answer and then its worker dies (its handler cancelled mid-stream: nothing more
is sent, no outcome) or is drained (handed over mid-stream); the scheduler's part is done by hand (the fence
raised, the Dispatch of attempt 2 with the earlier attempt). The reader must see one seamless answer; the
result must record both legs, each one's tokens equal to its chunks', the whole text equal to the chunks'.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from aiokafka.structs import ConsumerRecord
from prometheus_client import REGISTRY

from llmbus.bus import Bus, decode
from llmbus.bus.tables import read_since
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.chunks import ChunkAssembler
from llmbus.contract.messages import (
    Dispatch,
    DispatchOutcome,
    EarlierAttempt,
    ErrorCode,
    InferenceRequest,
    InferenceResult,
    LegEnd,
    OutcomeStatus,
    ResultStatus,
    RoutedRequest,
    TokenChunk,
)
from llmbus.settings import BusSettings
from llmbus.state.store import dispatch_markers, redis_client
from llmbus_services.engine_worker.adapters.engines.sim import SimConfig, SimEngine
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.flows import WorkerHandlers

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

MODEL = "sim-llama-8b"
ANSWER_TOKENS = 60


@pytest.fixture
async def bus(bus_settings: BusSettings) -> AsyncIterator[Bus]:
    started = await Bus.start(bus_settings, t.WORKER, client_suffix=f"-{uuid.uuid4().hex[:6]}")
    yield started
    await started.stop()


async def worker(bus: Bus, worker_id: str, **settings: object) -> WorkerHandlers:
    """A sim worker's flows: sampled answers, 40 ms steps (25 tokens a second)."""
    engine = SimEngine(SimConfig(model=MODEL, speedup=1.0, step_base_us=40_000, sample_unseeded=True))
    await engine.start()
    ws = WorkerSettings(worker_id=worker_id, chunk_max_tokens=4, **settings)  # type: ignore[arg-type]
    redis = redis_client(bus.settings.redis_url)
    return WorkerHandlers(bus, ws, engine, dispatch_markers(redis, bus.settings.topic_prefix))


def record(dispatch: Dispatch) -> ConsumerRecord:
    raw = dispatch.to_bytes()
    return ConsumerRecord("dispatch", 0, 0, 0, 0, None, raw, None, 0, len(raw), [])


def request(**fields: object) -> RoutedRequest:
    ask = InferenceRequest(
        request_id=f"r-{uuid.uuid4().hex[:8]}",
        tenant="acme",
        prompt="tell a long story about kafka",
        max_tokens=ANSWER_TOKENS,
        temperature=0.9,
        **fields,  # type: ignore[arg-type]
    )
    return RoutedRequest(request=ask, model=MODEL)


async def chunks_until(tail: TopicTail, request_id: str, done, timeout_s: float = 60) -> list[TokenChunk]:  # type: ignore[no-untyped-def]
    seen: list[TokenChunk] = []
    async for rec in tail.records(timeout_s):
        chunk = decode(rec, TokenChunk)
        if chunk.request_id == request_id:  # type: ignore[attr-defined]
            seen.append(chunk)  # type: ignore[arg-type]
            if done(seen):
                return seen
    raise TimeoutError(f"{request_id}: {len(seen)} chunks")


async def first_of(tail: TopicTail, model: type, request_id: str, timeout_s: float = 60):  # type: ignore[no-untyped-def]
    async for rec in tail.records(timeout_s):
        message = decode(rec, model)
        if message.request_id == request_id:  # type: ignore[attr-defined]
            return message
    raise TimeoutError(request_id)


async def all_chunks(settings: BusSettings, routed: RoutedRequest) -> list[TokenChunk]:
    """The request's chunks on its reply topic, in the order they were written."""
    topic = t.Topics(settings.topic_prefix).name(t.TOKENS)
    found = await read_since(settings, topic, TokenChunk, routed.received_at_ms - 5_000, 30, key=routed.request_id)
    return [c for c in found if c.request_id == routed.request_id]


def check_legs(result: InferenceResult, chunks: list[TokenChunk]) -> None:
    """Token by token: each leg's chunks carry exactly its tokens and characters, and the answer's tokens
    (the sim's are one word each) are the legs' sum: no span repeated, none missing."""
    assembler = ChunkAssembler()
    for chunk in chunks:
        assembler.add(chunk)
    assert assembler.restarts == 0 and assembler.continuations == 1
    assert assembler.text == result.text and result.status == ResultStatus.OK
    answer = [c for segment in assembler.segments(assembler.attempt) for c in segment.chunks]
    assert [c.seq for c in answer] == list(range(len(answer)))
    assert result.legs is not None and len(result.legs) == 2
    bounds = [leg.first_seq for leg in result.legs] + [len(answer)]
    for leg, start, end in zip(result.legs, bounds, bounds[1:], strict=False):
        mine = answer[start:end]
        assert {c.attempt for c in mine} == {leg.attempt}
        assert sum(c.tokens for c in mine) == leg.completion_tokens
        assert sum(len(c.delta) for c in mine) == leg.text_chars
    tokens = sum(leg.completion_tokens for leg in result.legs)
    assert len(result.text.split()) == tokens == result.usage.completion_tokens == ANSWER_TOKENS


async def cut_after(handlers: WorkerHandlers, dispatch: Dispatch, tail: TopicTail, chunks: int) -> asyncio.Task[None]:
    """Attempt 1 running until `chunks` of it are on the reply topic."""
    task = asyncio.create_task(handlers.on_dispatch(record(dispatch)))
    await chunks_until(tail, dispatch.request_id, lambda seen: len(seen) >= chunks)
    return task


def counted(metric: str, **labels: str) -> float:
    """A worker metric's count in this process (the workers here run in it)."""
    return REGISTRY.get_sample_value(metric, labels) or 0.0


async def test_an_answer_cut_by_a_dead_worker_is_continued_seamlessly(bus: Bus, bus_settings: BusSettings) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    replies = await TopicTail(bus_settings, topics.name(t.TOKENS)).start()
    results = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    a, b = await worker(bus, "w-a"), await worker(bus, "w-b")
    routed = request()
    continued_before = counted("llmbus_worker_continuations_total", cause="worker_lost")
    try:
        first = Dispatch(routed=routed, worker_id="w-a", attempt=1)
        dying = await cut_after(a, first, replies, chunks=3)
        dying.cancel()  # the worker dies: nothing more from it, no outcome
        await asyncio.gather(dying, return_exceptions=True)
        await b.fence.supersede(routed.request_key, 2)  # what the scheduler does before attempt 2
        lost = EarlierAttempt(attempt=1, worker_id="w-a", ended=ErrorCode.WORKER_LOST)
        await b.on_dispatch(record(Dispatch(routed=routed, worker_id="w-b", attempt=2, earlier=[lost])))
        result = await first_of(results, InferenceResult, routed.request_id)
        chunks = await all_chunks(bus_settings, routed)
        check_legs(result, chunks)
        assert [(leg.worker_id, leg.ended) for leg in result.legs] == [
            ("w-a", LegEnd.WORKER_LOST),
            ("w-b", LegEnd.COMPLETED),
        ]
        assert result.legs[1].prompt_tokens == result.legs[0].prompt_tokens + result.legs[0].completion_tokens
        assert counted("llmbus_worker_continuations_total", cause="worker_lost") == continued_before + 1
    finally:
        for tail in (replies, results):
            await tail.stop()


async def test_a_drained_worker_hands_its_answer_over_mid_stream(bus: Bus, bus_settings: BusSettings) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    replies = await TopicTail(bus_settings, topics.name(t.TOKENS)).start()
    outcomes = await TopicTail(bus_settings, topics.name(t.OUTCOMES)).start()
    results = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    a, b = await worker(bus, "w-a"), await worker(bus, "w-b")
    routed = request()
    try:
        running = await cut_after(a, Dispatch(routed=routed, worker_id="w-a", attempt=1), replies, chunks=3)
        a.draining = True
        await a.hand_over()  # the drain's handover, its grace over
        await asyncio.wait_for(running, 30)
        outcome = await first_of(outcomes, DispatchOutcome, routed.request_id)
        assert outcome.status == OutcomeStatus.RETRYABLE and outcome.error.code == ErrorCode.HANDED_BACK
        await b.fence.supersede(routed.request_key, 2)
        drained = EarlierAttempt(attempt=1, worker_id="w-a", ended=outcome.error.code)
        await b.on_dispatch(record(Dispatch(routed=routed, worker_id="w-b", attempt=2, earlier=[drained])))
        result = await first_of(results, InferenceResult, routed.request_id)
        check_legs(result, await all_chunks(bus_settings, routed))
        assert [leg.ended for leg in result.legs] == [LegEnd.DRAINED, LegEnd.COMPLETED]
    finally:
        for tail in (replies, outcomes, results):
            await tail.stop()


async def test_a_cut_beyond_the_migration_limit_ends_the_answer(bus: Bus, bus_settings: BusSettings) -> None:
    """migration_limit 1: never continued. The final error keeps the text the client has, and its final
    chunk goes on from it (one stream, then the error)."""
    topics = t.Topics(bus_settings.topic_prefix)
    replies = await TopicTail(bus_settings, topics.name(t.TOKENS)).start()
    results = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    a, b = await worker(bus, "w-a"), await worker(bus, "w-b")
    routed = request(migration_limit=1)
    refused_before = counted("llmbus_worker_continuations_refused_total", reason="migration_limit")
    try:
        dying = await cut_after(a, Dispatch(routed=routed, worker_id="w-a", attempt=1), replies, chunks=2)
        dying.cancel()
        await asyncio.gather(dying, return_exceptions=True)
        await b.fence.supersede(routed.request_key, 2)
        await b.on_dispatch(record(Dispatch(routed=routed, worker_id="w-b", attempt=2)))
        result = await first_of(results, InferenceResult, routed.request_id)
        assert result.status == ResultStatus.ERROR and result.error.code == ErrorCode.MIGRATION_LIMIT
        assembler = ChunkAssembler()
        for chunk in await all_chunks(bus_settings, routed):
            assembler.add(chunk)
        assert assembler.done and assembler.restarts == 0 and assembler.text == result.text != ""
        assert result.legs is not None and len(result.legs) == 1
        assert result.usage.completion_tokens == result.legs[0].completion_tokens == len(result.text.split())
        assert counted("llmbus_worker_continuations_refused_total", reason="migration_limit") == refused_before + 1
    finally:
        for tail in (replies, results):
            await tail.stop()
