"""Coalescing state on the real Redis: one leader per key, followers handed over once, overdue ones found."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as redis

from llmbus.contract.messages import InferenceRequest, RoutedRequest, now_ms
from llmbus_services.router.adapters.coalescing import RedisCoalescer

pytestmark = pytest.mark.redis


def routed(request_id: str) -> RoutedRequest:
    return RoutedRequest(request=InferenceRequest(request_id=request_id, prompt="q", temperature=0.0), model="m")


async def test_one_leader_and_each_follower_handed_over_once(client: redis.Redis, namespace: str) -> None:
    store = RedisCoalescer(client, namespace, lead_ttl_s=30, max_wait_s=60)
    joined = await asyncio.gather(*[store.join("acme:k", routed(f"r{i}")) for i in range(8)])
    leaders = [i for i, leader in enumerate(joined) if leader is None]
    assert len(leaders) == 1  # the script is atomic: exactly one of eight concurrent joins leads
    leader_id = f"default:r{leaders[0]}"  # leaders and followers by request key
    assert {leader for leader in joined if leader} == {leader_id}
    again = routed("r1" if leader_id != "default:r1" else "r2")
    assert await store.join("acme:k", again) == leader_id  # redelivery: same
    assert await store.join("acme:other", routed("x")) is None  # another key, another leader

    followers = await store.finish(leader_id)
    assert sorted(followers) == sorted(f"default:r{i}" for i in range(8) if f"default:r{i}" != leader_id)
    assert await store.finish(leader_id) == []  # handed over once
    assert await store.join("acme:k", routed("late")) is None  # after the leader finished, a newcomer leads

    first = await store.claim(followers[0])
    assert first is not None and first.request_key == followers[0]
    assert await store.claim(followers[0]) is None  # claimed: nobody else answers it
    await store.done(followers[0])
    assert followers[0] not in await client.zrange(f"llmbus:{namespace}:coalesce:waiting", 0, -1)


async def test_followers_handed_to_a_relay_that_dies_are_overdue_after_one_lease(
    client: redis.Redis, namespace: str
) -> None:
    store = RedisCoalescer(client, namespace, lead_ttl_s=30, max_wait_s=60, claim_lease_s=0.3)
    assert await store.join("acme:k", routed("lead")) is None
    assert await store.join("acme:k", routed("f")) == "default:lead"
    assert await store.finish("default:lead") == ["default:f"]
    assert await store.claim("default:f") is not None  # ... and the relay dies here, before answering
    assert await store.overdue() == []
    await asyncio.sleep(0.45)
    assert await store.overdue() == ["default:f"]  # not after max_wait_s (60 s): after the lease
    again = await store.claim("default:f")  # the claim expired with the lease: the sweeper may take it
    assert again is not None and again.request_key == "default:f"


async def test_followers_of_a_silent_leader_become_overdue(client: redis.Redis, namespace: str) -> None:
    store = RedisCoalescer(client, namespace, lead_ttl_s=0.2, max_wait_s=0.3)
    assert await store.join("acme:k", routed("lead")) is None
    assert await store.join("acme:k", routed("f")) == "default:lead"
    assert await store.overdue() == []
    await asyncio.sleep(0.4)
    assert await store.overdue() == ["default:f"]
    parked = await store.claim("default:f")
    assert parked is not None and parked.request_key == "default:f"
    await store.done("default:f")
    assert await store.overdue() == []
    assert await store.join("acme:k", routed("next")) is None  # the lead expired with its TTL


async def test_a_follower_with_a_deadline_is_overdue_at_its_deadline(client: redis.Redis, namespace: str) -> None:
    store = RedisCoalescer(client, namespace, lead_ttl_s=30, max_wait_s=60)
    assert await store.join("acme:k", routed("lead")) is None
    soon = routed("soon")
    soon = soon.model_copy(update={"request": soon.request.model_copy(update={"deadline_ms": now_ms() + 200})})
    assert await store.join("acme:k", soon) == "default:lead"
    assert await store.join("acme:k", routed("patient")) == "default:lead"
    await asyncio.sleep(0.3)
    assert await store.overdue() == ["default:soon"]  # routed alone now: the scheduler ends it at its deadline
