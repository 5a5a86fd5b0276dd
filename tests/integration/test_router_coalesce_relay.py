"""The coalescing relay on the real Redis (publisher recorded): each follower ends exactly once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from llmbus.contract import topics as t
from llmbus.contract.messages import (
    ErrorCode,
    ErrorInfo,
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    RoutedRequest,
    TokenChunk,
    Usage,
)
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_services.router.adapters.coalesce_relay import CoalesceRelay
from llmbus_services.router.adapters.coalescing import RedisCoalescer
from llmbus_services.router.core.config import CoalescePolicy
from tests.support import redis_keys
from tests.unit.test_worker_request_errors import FakeBus, MemoryFence, RecordingPublisher

pytestmark = pytest.mark.redis
KEY = "acme:k"


@pytest.fixture
async def store() -> AsyncIterator[RedisCoalescer]:
    client = redis_client(BusSettings().redis_url)
    namespace = f"test-relay-{uuid.uuid4().hex[:10]}"
    yield RedisCoalescer(client, namespace, lead_ttl_s=30, max_wait_s=30, claim_lease_s=30)
    keys = await redis_keys(client, f"llmbus:{namespace}:*")
    if keys:
        await client.delete(*keys)
    await client.aclose()


def routed(request_id: str) -> RoutedRequest:
    request = InferenceRequest(
        request_id=request_id, tenant="acme", prompt="q", temperature=0.0, reply_topic=f"llm.replies.{request_id}"
    )
    return RoutedRequest(request=request, model="m", route_reason="default")


def relay_on(store: RedisCoalescer, fence: MemoryFence) -> tuple[CoalesceRelay, RecordingPublisher]:
    publisher = RecordingPublisher()
    bus = FakeBus(publisher, service="router")
    return CoalesceRelay(bus, store, CoalescePolicy(), fence.claim_final_0, fence.final_published_0), publisher  # type: ignore[arg-type]


class Fence(MemoryFence):
    async def claim_final_0(self, request_id: str) -> bool:
        return await self.claim_final(request_id, 0)

    async def final_published_0(self, request_id: str) -> None:
        await self.final_published(request_id, 0)


async def park(store: RedisCoalescer, n: int) -> list[str]:
    assert await store.join(KEY, routed("lead")) is None
    ids = [f"f{i}" for i in range(n)]
    assert await asyncio.gather(*[store.join(KEY, routed(i)) for i in ids]) == ["acme:lead"] * n  # by request key
    return ids


async def test_followers_get_the_leaders_answer_once_each_on_their_own_topics(store: RedisCoalescer) -> None:
    fence = Fence()
    followers = await park(store, 3)
    await fence.claim_final("acme:f2", 1)  # f2 was answered elsewhere already (a redelivered copy, say)
    relay, publisher = relay_on(store, fence)
    leader = InferenceResult(
        request_id="lead", tenant="acme", status=ResultStatus.OK, model="m", text="42", usage=Usage(completion_tokens=1)
    )
    # Two relays see the same result (a redelivery): the followers are handed over once.
    other, other_publisher = relay_on(store, fence)
    await asyncio.gather(relay.on_result(leader), other.on_result(leader))
    sent = publisher.sent + other_publisher.sent
    results = [v for _, v in sent if isinstance(v, InferenceResult)]
    assert sorted(r.request_id for r in results) == ["f0", "f1"]  # f2's marker was taken: not answered twice
    assert all(r.cached and r.text == "42" and r.tenant == "acme" for r in results)
    for follower_id in ("f0", "f1"):
        chunks = [(topic, v) for topic, v in sent if isinstance(v, TokenChunk) and v.request_id == follower_id]
        assert [topic for topic, _ in chunks] == [f"x.llm.replies.{follower_id}"] * 2
        assert [(c.seq, c.delta, c.final) for _, c in chunks] == [(0, "42", False), (1, "", True)]
    assert await store.overdue() == [] and sorted(followers) == ["f0", "f1", "f2"]
    assert await store.claim("f0") is None  # done: nothing left to answer


async def test_a_failed_leader_sends_followers_to_their_own_generation(store: RedisCoalescer) -> None:
    await park(store, 2)
    relay, publisher = relay_on(store, Fence())
    failed = InferenceResult(
        request_id="lead",
        tenant="acme",
        status=ResultStatus.ERROR,
        error=ErrorInfo.of(ErrorCode.WORKER_LOST, "gone"),
    )
    await relay.on_result(failed)
    again = [v for topic, v in publisher.sent if topic == f"x.{t.ROUTED}"]
    assert sorted(r.request_id for r in again) == ["f0", "f1"]  # type: ignore[attr-defined]
    assert not [v for _, v in publisher.sent if isinstance(v, InferenceResult)]


async def test_the_sweeper_routes_followers_whose_leader_never_answers(store: RedisCoalescer) -> None:
    short = RedisCoalescer(store._client, store.namespace, lead_ttl_s=0.2, max_wait_s=0.2)
    await park(short, 2)
    relay, publisher = relay_on(short, Fence())
    assert await relay.sweep_once() == 0
    await asyncio.sleep(0.3)
    assert await relay.sweep_once() == 2
    assert await relay.sweep_once() == 0  # each once
    again = [v for _, v in publisher.sent if isinstance(v, RoutedRequest)]
    assert sorted(r.request_id for r in again) == ["f0", "f1"]
    assert all(r.route_reason == "coalesce_fallback:timeout:default" for r in again)
    await relay.on_result(
        InferenceResult(request_id="lead", tenant="acme", status=ResultStatus.OK, text="late")
    )  # the leader's late result finds nobody left to answer
    assert not [v for _, v in publisher.sent if isinstance(v, InferenceResult)]
