"""State written under the names from before the hash tags, on one Redis: nothing of it is lost.

cost-accounting's keys moved from `<prefix>cost:…` to `{<prefix>cost}:…` and coalescing's from
`llmbus:<ns>:coalesce:…` to `llmbus:{<ns>:coalesce}:…` (llmbus.state.keys), so each family fits
one slot of a Redis Cluster. A deployment upgraded on its single Redis keeps its markers, outbox,
held results and totals (moved once, at cost-accounting's start) and its parked followers (still swept).
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as redis

from llmbus.contract.messages import InferenceRequest, RoutedRequest, now_ms
from llmbus.state.keys import legacy_coalesce_key_root, legacy_cost_key_root
from llmbus_services.cost_accounting.adapters.store import CostStore
from llmbus_services.cost_accounting.core.aggregates import agg_key
from llmbus_services.router.adapters.coalescing import RedisCoalescer
from tests.support import redis_keys

pytestmark = pytest.mark.redis


async def test_cost_keys_from_before_the_tag_are_moved_once_and_go_on_as_they_were(
    client: redis.Redis, local_prefix: str
) -> None:
    prefix = local_prefix
    legacy = legacy_cost_key_root(prefix)
    at_ms = now_ms()
    totals = agg_key(prefix, "month", at_ms, "tenant").removeprefix("{" + prefix + "cost}:")
    await client.set(f"{legacy}state", "state-1")
    await client.set(f"{legacy}applied:acme:r1", "1", ex=3600)
    await client.set(f"{legacy}seen:acme:r1", "1", ex=3600)
    await client.hset(f"{legacy}{totals}", mapping={"acme|cost": 4000, "acme|requests": 4})
    await client.hset(f"{legacy}outbox", "acme:r2", b'{"staged": true}')
    await client.hset(f"{legacy}cursor", "w1", "{}")
    stores = [CostStore(client, prefix, dedupe_ttl_s=3600) for _ in range(2)]  # two replicas start at once
    moved = await asyncio.gather(*(store.adopt_untagged_keys(wait_s=30) for store in stores))
    assert sorted(moved) == [0, 6], moved  # one replica moved them, the other waited for it
    assert not await redis_keys(client, f"{legacy}*")
    store = stores[0]
    assert await store.state_id() == "state-1"  # not a data loss: nothing is rebuilt
    assert await store.applied(["acme:r1"]) == [True]
    assert await store.tenant_spent([(agg_key(prefix, "month", at_ms, "tenant"), "acme")]) == [4000]
    assert await store.staged() == [b'{"staged": true}']
    assert await store.cursor("w1") == {}
    assert await client.ttl(f"{store.root}applied:acme:r1") > 0  # TTLs move with the keys
    assert await store.adopt_untagged_keys() == 0  # once


async def test_a_follower_parked_under_the_old_names_is_still_swept_and_answered(
    client: redis.Redis, local_prefix: str
) -> None:
    prefix = local_prefix
    namespace = f"{prefix}router"
    legacy = legacy_coalesce_key_root(namespace)
    follower = RoutedRequest(request=InferenceRequest(request_id="f1", prompt="same", max_tokens=4), model="m")
    await client.set(f"{legacy}parked:{follower.request_key}", follower.model_dump_json(), px=60_000)
    await client.zadd(f"{legacy}waiting", {follower.request_key: now_ms() - 1})
    coalescer = RedisCoalescer(client, namespace, lead_ttl_s=30, max_wait_s=30)
    assert await coalescer.overdue() == [follower.request_key]
    claimed = await coalescer.claim(follower.request_key)
    assert claimed is not None and claimed.request_id == "f1"
    await coalescer.done(follower.request_key)
    assert await coalescer.overdue() == []
    assert not await client.exists(f"{legacy}parked:{follower.request_key}")
