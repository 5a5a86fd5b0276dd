"""Placement claims on the real Redis: bounded in time, read in batches, released only by their owner."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as redis

from llmbus.contract.messages import InferenceRequest, RoutedRequest
from llmbus.contract.request_key import request_key
from llmbus_services.scheduler.adapters.store import PlacementStore
from llmbus_services.scheduler.core.types import Placement, SchedRequest

pytestmark = pytest.mark.redis


def placement(request_id: str, attempt: int = 1, worker: str = "w1") -> Placement:
    routed = RoutedRequest(request=InferenceRequest(request_id=request_id, prompt="hi", max_tokens=4), model="m")
    request = SchedRequest.from_routed(routed, 1_000)
    request.attempt = attempt
    return Placement(request_id, attempt, worker, "m", 1, 1_000, request)


async def test_only_the_owner_releases_a_claim(client: redis.Redis, namespace: str) -> None:
    old_owner = PlacementStore(client, namespace, "old-owner")
    new_owner = PlacementStore(client, namespace, "new-owner")
    assert await new_owner.claim(placement("r1"))
    assert not await old_owner.claim(placement("r1"))  # the race: one claim per attempt
    # The old owner (it lost the partition in a rebalance) gives up on r1: the new owner's claim stays.
    assert not await old_owner.release_own(request_key("default", "r1"), 1)
    assert json.loads(await client.get(new_owner.key(request_key("default", "r1"), 1)))["instance"] == "new-owner"
    assert await new_owner.release_own(request_key("default", "r1"), 1)
    assert await client.get(new_owner.key(request_key("default", "r1"), 1)) is None


async def test_claims_expire_and_an_outcome_releases_any_owners(client: redis.Redis, namespace: str) -> None:
    store = PlacementStore(client, namespace, "s1", ttl_s=120)
    await store.claim(placement("r2"))
    assert 0 < await client.ttl(store.key(request_key("default", "r2"), 1)) <= 120, (
        "a claim whose outcome never comes must not stay forever"
    )
    await PlacementStore(client, namespace, "s2").release(
        request_key("default", "r2"), 1
    )  # the attempt's outcome, read by s2
    assert await client.get(store.key(request_key("default", "r2"), 1)) is None


async def test_load_walks_every_claim_in_batches_and_keeps_the_latest_attempt(
    client: redis.Redis, namespace: str
) -> None:
    store = PlacementStore(client, namespace, "s1", scan_batch=100)
    for i in range(450):
        await store.claim(placement(f"r{i}"))
    await store.claim(placement("r7", attempt=2, worker="w2"))
    loaded = {p.request_id: p for p in await store.load(16, 8)}
    assert len(loaded) == 450
    assert (loaded["r7"].attempt, loaded["r7"].worker_id) == (2, "w2")
