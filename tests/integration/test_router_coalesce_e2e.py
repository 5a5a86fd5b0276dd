"""Request coalescing end to end on the real broker and Redis: router + scheduler (+ a sim worker).

N identical deterministic requests sent together cost one generation, and each client still
gets its own complete stream and exactly one result; when the leader fails for a reason of its
own (here its deadline, with no worker to take it), every follower is routed on its own and
gets exactly one result too — nobody hangs.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import TypeVar

import pytest

from llmbus.bus import Bus, decode
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.chunks import ChunkAssembler
from llmbus.contract.messages import (
    ChatMessage,
    ErrorCode,
    InferenceRequest,
    InferenceResult,
    Message,
    ResultStatus,
    RoutedRequest,
    TokenChunk,
    now_ms,
)
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready

pytestmark = [pytest.mark.kafka, pytest.mark.redis]
N = 5
M = TypeVar("M", bound=Message)


async def read_until(
    tail: TopicTail, kind: type[M], ids: set[str], done: Callable[[list[M]], bool], timeout_s: float
) -> list[M]:
    """Messages of `ids` read from `tail` until `done` says so (or the time is up)."""
    got: list[M] = []
    if done(got):
        return got
    async for record in tail.records(timeout_s):
        message = decode(record, kind)  # type: ignore[arg-type]
        if getattr(message, "request_id", None) in ids:
            got.append(message)
            if done(got):
                break
    return got


def finals_of_all(ids: set[str]) -> Callable[[list[TokenChunk]], bool]:
    return lambda chunks: {c.request_id for c in chunks if c.final} == ids


def results_of_all(ids: set[str]) -> Callable[[list[InferenceResult]], bool]:
    return lambda results: {r.request_id for r in results} == ids


def routed_all(ids: set[str]) -> Callable[[list[RoutedRequest]], bool]:
    return lambda routed: {r.request_id for r in routed} == ids


def never(_: list[Message]) -> bool:
    return False


def identical_asks(run: str, **fields: object) -> list[InferenceRequest]:
    return [
        InferenceRequest(
            request_id=f"{run}-{i}",
            tenant="acme",
            temperature=0.0,
            messages=[ChatMessage(role="user", content=f"Explain Kafka consumer groups ({run}).")],
            **fields,  # type: ignore[arg-type]
        )
        for i in range(N)
    ]


async def waiting_followers(settings: BusSettings) -> int:
    redis = redis_client(settings.redis_url)
    try:
        return int(await redis.zcard(f"llmbus:{settings.topic_prefix}router:coalesce:waiting"))
    finally:
        await redis.aclose()


async def test_identical_requests_in_flight_share_one_generation(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    services.append(ServiceProc("llmbus_services.router", bus_settings).start())
    services.append(ServiceProc("llmbus_services.scheduler", bus_settings).start())
    worker_env = {"LLMBUS_WORKER_WORKER_ID": "w1", "LLMBUS_WORKER_MODEL": "sim-llama-8b"}
    services.append(ServiceProc("llmbus_services.engine_worker", bus_settings, name="w1", env=worker_env).start())
    await wait_workers_ready(bus_settings, {"w1"}, timeout_s=120)
    bus = await Bus.start(bus_settings, t.CLIENT)
    tails = [await TopicTail(bus_settings, topics.name(topic)).start() for topic in (t.TOKENS, t.RESULTS, t.ROUTED)]
    tokens_tail, results_tail, routed_tail = tails
    # Long enough an answer (the sim at real speed) that all N are in flight together.
    asks = identical_asks(uuid.uuid4().hex[:8], model="sim-llama-8b", max_tokens=64)
    ids = {a.request_id for a in asks}
    try:
        await asyncio.gather(*[bus.publisher.publish(topics.name(t.REQUESTS), a, key=a.request_id) for a in asks])
        chunks = await read_until(tokens_tail, TokenChunk, ids, finals_of_all(ids), timeout_s=120)
        results = await read_until(results_tail, InferenceResult, ids, results_of_all(ids), timeout_s=30)
        results += await read_until(results_tail, InferenceResult, ids, never, timeout_s=1.5)  # no second result
        routed = await read_until(routed_tail, RoutedRequest, ids, never, timeout_s=0.5)
    finally:
        for tail in tails:
            await tail.stop()
        await bus.stop()

    assert sorted(r.request_id for r in results) == sorted(ids)  # exactly one result each
    [generated] = [r for r in results if not r.cached]
    assert generated.status == ResultStatus.OK and generated.worker_id == "w1" and generated.text
    assert [r.request_id for r in routed] == [generated.request_id]  # one generation for N requests
    for result in results:
        assert result.status == ResultStatus.OK and result.text == generated.text
        assert result.usage == generated.usage
        if result is not generated:  # billed as a cache hit, answered by the router
            assert result.cached and result.worker_id is None and result.produced_by == "router"
            assert result.route_reason is not None
            assert result.route_reason.startswith(f"coalesced:{generated.request_id}:")
    for request_id in ids:  # each client's own complete stream, read by the chunk contract
        assembler = ChunkAssembler()
        for chunk in chunks:
            if chunk.request_id == request_id:
                assembler.add(chunk)
        assert assembler.done and assembler.text == generated.text, request_id
        assert assembler.final is not None and assembler.final.error is None
    assert await waiting_followers(bus_settings) == 0


async def test_followers_of_a_failed_leader_are_routed_alone_and_answered_once(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    services.append(ServiceProc("llmbus_services.router", bus_settings).start())
    services.append(ServiceProc("llmbus_services.scheduler", bus_settings).start())
    bus = await Bus.start(bus_settings, t.CLIENT)
    tails = [await TopicTail(bus_settings, topics.name(topic)).start() for topic in (t.TOKENS, t.RESULTS, t.ROUTED)]
    tokens_tail, results_tail, routed_tail = tails
    run = uuid.uuid4().hex[:8]
    try:
        # The router is up once a probe is routed; then the leader has its whole deadline in flight.
        probe = InferenceRequest(request_id=f"{run}-probe", model="sim-idle", prompt="probe", max_tokens=4)
        await bus.publisher.publish(topics.name(t.REQUESTS), probe, key=probe.request_id)
        up = await read_until(routed_tail, RoutedRequest, {probe.request_id}, bool, timeout_s=120)
        assert up, "the router did not route the probe"
        # No worker serves sim-idle: the leader fails at its deadline (the scheduler's deadline_exceeded).
        asks = identical_asks(run, model="sim-idle", max_tokens=8, deadline_ms=now_ms() + 3000)
        ids = {a.request_id for a in asks}
        await asyncio.gather(*[bus.publisher.publish(topics.name(t.REQUESTS), a, key=a.request_id) for a in asks])
        results = await read_until(results_tail, InferenceResult, ids, results_of_all(ids), timeout_s=60)
        results += await read_until(results_tail, InferenceResult, ids, never, timeout_s=1.5)
        chunks = await read_until(tokens_tail, TokenChunk, ids, finals_of_all(ids), timeout_s=10)
        # Every id's routed record (a loaded broker may hand them over late), then any second copy.
        routed = await read_until(routed_tail, RoutedRequest, ids, routed_all(ids), timeout_s=15)
        routed += await read_until(routed_tail, RoutedRequest, ids, never, timeout_s=0.5)
    finally:
        for tail in tails:
            await tail.stop()
        await bus.stop()

    assert sorted(r.request_id for r in results) == sorted(ids)  # exactly one result each, none hangs
    for result in results:
        assert result.status == ResultStatus.ERROR and not result.cached
        assert result.error is not None and result.error.code == ErrorCode.DEADLINE_EXCEEDED
    assert sorted(r.request_id for r in routed) == sorted(ids)  # the leader, then each follower alone
    [leader] = [r for r in routed if not r.route_reason.startswith("coalesce_fallback:")]
    # Leader and followers share one deadline: a follower goes alone either on the leader's failure
    # or, when its own wait (the same deadline) runs out first on a loaded machine, by the sweeper.
    fallbacks = ("coalesce_fallback:leader_failed:deadline_exceeded:", "coalesce_fallback:timeout:")
    for follower in routed:
        if follower is not leader:
            assert follower.route_reason.startswith(fallbacks), follower.route_reason
    assert {c.request_id for c in chunks if c.final} == ids  # each client's stream ends
    assert await waiting_followers(bus_settings) == 0
