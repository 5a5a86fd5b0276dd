"""The hot-path Redis scripts on a real 3-master Redis Cluster (tests/fixtures/redis_cluster.py).

A script may touch only the keys it is given (KEYS), and on a cluster those keys must share one slot
(else CROSSSLOT). The fence's claims, the batcher's pipelines (commands for many slots, so many
nodes, in one batch; a script the nodes forgot) and the router's limiter run here through the same
client factory the services use with LLMBUS_REDIS_CLUSTER=true.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as redis
from redis.cluster import key_slot

from llmbus.contract.messages import InferenceRequest, now_ms
from llmbus.contract.request_key import request_key
from llmbus.state.fencing import RequestFence, Superseded
from llmbus.state.redis_batch import RedisBatcher
from llmbus_services.router.adapters.cache import RedisResponseCache
from llmbus_services.router.adapters.limits import RedisRateLimiter
from llmbus_services.router.core.cache_key import cache_key
from llmbus_services.router.core.config import TenantPolicy
from llmbus_services.scheduler.adapters.store import PlacementStore
from tests.integration.test_comparator_join import Harness, pair_stats, res, shadow_view
from tests.integration.test_placement_store_redis import placement
from tests.integration.test_router_redis_cache import ok_result
from tests.support import drop_keys

pytestmark = pytest.mark.redis


@pytest.fixture
def namespace() -> str:
    return f"test-cluster-{uuid.uuid4().hex[:10]}"


async def _clean(client: redis.Redis, namespace: str) -> None:
    await drop_keys(client, f"llmbus:{namespace}:*")  # a cluster client's SCAN visits every primary


async def test_the_fence_scripts_run_on_a_cluster(cluster: redis.Redis, namespace: str) -> None:
    fence = RequestFence(cluster, namespace, final_ttl_s=3600, claim_lease_s=5)
    try:
        assert await fence.claim_final("r-1", 1)  # keys of two slots: CROSSSLOT
        final, fence_key = fence._keys("r-1")
        assert key_slot(final.encode()) == key_slot(fence_key.encode()), "one script, one slot"
        assert not await fence.claim_final("r-1", 2)
        assert not await fence.superseded("r-1", 1) and await fence.superseded("r-1", 2)
        await fence.final_published("r-1", 1)
        assert await fence.holder("r-1") == "done:1"
        assert await fence.supersede("r-1", 2) == Superseded.RESULT_OUT

        assert await fence.supersede("r-2", 2) == Superseded.FENCED
        assert await fence.superseded("r-2", 1) and not await fence.claim_final("r-2", 1)
        assert await fence.restart("r-2")
        assert await fence.claim_for_error("r-2") and await fence.holder("r-2") == "done:scheduler"
        assert not await fence.restart("r-2")
    finally:
        await _clean(cluster, namespace)


async def test_ids_with_braces_keep_one_slot(cluster: redis.Redis, namespace: str) -> None:
    """A client chooses its request ids: braces in one must not split its keys over two slots."""
    fence = RequestFence(cluster, namespace, final_ttl_s=3600, claim_lease_s=5)
    try:
        for request_id in ("}x", "{y}", "a}{b", "{", "}", "{}", ""):
            final, fence_key = fence._keys(request_id)
            assert key_slot(final.encode()) == key_slot(fence_key.encode()), request_id
            assert await fence.supersede(request_id, 2) == Superseded.FENCED
            assert await fence.claim_final(request_id, 2), request_id
    finally:
        await _clean(cluster, namespace)


async def test_concurrent_claims_of_many_requests_share_pipelines_across_nodes(
    cluster: redis.Redis, namespace: str
) -> None:
    """Concurrent callers' scripts batch into cluster pipelines whose commands go to all three nodes."""
    fence = RequestFence(cluster, namespace, final_ttl_s=3600, claim_lease_s=5)
    ids = [f"req-{i}" for i in range(300)]
    try:
        slots = {key_slot(fence._keys(i)[0].encode()) for i in ids}
        nodes = {cluster.get_node_from_key(fence._keys(i)[0]).name for i in ids}  # type: ignore[attr-defined]
        assert len(slots) > 100 and len(nodes) == 3
        first = await asyncio.gather(*(fence.claim_final(i, 1) for i in ids))
        again = await asyncio.gather(*(fence.claim_final(i, 2) for i in ids))
        assert all(first) and not any(again)
        await asyncio.gather(*(fence.final_published(i, 1) for i in ids))
        assert set(await asyncio.gather(*(fence.holder(i) for i in ids))) == {"done:1"}
    finally:
        await _clean(cluster, namespace)


async def test_concurrent_reads_of_a_fence_batch_into_cluster_pipelines(cluster: redis.Redis, namespace: str) -> None:
    """`superseded` and `lapsed_claim_ms` read two keys with MGET: called at once by many requests (a worker or
    scheduler under load) they share a cluster pipeline, where redis-py refuses a pipelined mget() even for
    keys of one slot ("Calling pipelined function mget is blocked"): every dispatch of the batch failed."""
    fence = RequestFence(cluster, namespace, final_ttl_s=3600, claim_lease_s=5)
    ids = [f"req-{i}" for i in range(200)]
    try:
        fenced = await asyncio.gather(*(fence.supersede(i, 2) for i in ids[:100]))
        assert set(fenced) == {Superseded.FENCED}
        superseded = await asyncio.gather(*(fence.superseded(i, 1) for i in ids))
        assert superseded == [True] * 100 + [False] * 100
        assert await asyncio.gather(*(fence.lapsed_claim_ms(i) for i in ids)) == [None] * 200
    finally:
        await _clean(cluster, namespace)


async def test_a_script_the_nodes_forgot_is_loaded_again(cluster: redis.Redis, namespace: str) -> None:
    """After SCRIPT FLUSH on every node, a lone call and a batch of calls still run (NOSCRIPT → load)."""
    batch = RedisBatcher(cluster)
    incr = batch.script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    keys = [f"llmbus:{namespace}:{{n:{i}}}:count" for i in range(60)]
    try:
        assert await incr([keys[0]], [1]) == 1
        await cluster.script_flush()  # every primary
        assert await incr([keys[0]], [1]) == 2, "alone"
        await cluster.script_flush()
        assert await asyncio.gather(*(incr([k], [5]) for k in keys)) == [7] + [5] * 59, "in pipelines"
    finally:
        await _clean(cluster, namespace)


async def test_the_router_limiter_runs_on_a_cluster(cluster: redis.Redis, namespace: str) -> None:
    """The limiter fails open on a Redis error, so a CROSSSLOT would let everything through: refusals prove it ran."""
    limiter = RedisRateLimiter(cluster, namespace)
    policy = TenantPolicy(requests_per_s=0.001, burst_requests=3, tokens_per_min=1_000_000)
    try:
        requests_key, tokens_key = limiter.keys("acme")
        assert key_slot(requests_key.encode()) == key_slot(tokens_key.encode())
        decisions = [await limiter.take("acme", policy, 10) for _ in range(5)]
        assert [d.allowed for d in decisions] == [True, True, True, False, False]
        assert decisions[-1].limit == "requests"
        assert (await limiter.take("globex", policy, 10)).allowed, "another tenant's own buckets"
    finally:
        await _clean(cluster, namespace)


async def test_the_router_cache_fills_and_hits_on_a_cluster(cluster: redis.Redis, namespace: str) -> None:
    """The cache treats a Redis error as a miss, so only a hit after the fill proves the mark was kept."""
    cache = RedisResponseCache(cluster, namespace, ttl_s=60)
    key = cache_key(InferenceRequest(prompt="2+2?", temperature=0.0, tenant="acme"), "m")
    try:
        assert await cache.lookup(key, pending_id="acme:r-1") is None
        assert await cache.complete(ok_result("r-1", "acme")), "the miss was marked pending"
        hit = await cache.lookup(key, pending_id="acme:r-2")
        assert hit is not None and hit.text == "4"
    finally:
        await _clean(cluster, namespace)


async def test_the_scheduler_placements_resume_from_a_cluster(cluster: redis.Redis, namespace: str) -> None:
    """Claims land on every node; a restarted scheduler reads them all back (SCAN visits each primary)."""
    store = PlacementStore(cluster, namespace, "s1", scan_batch=50)
    try:
        assert all(await asyncio.gather(*(store.claim(placement(f"r{i}")) for i in range(120))))
        assert await store.claim(placement("r7", attempt=2, worker="w2"))
        assert not await PlacementStore(cluster, namespace, "s2").release_own(request_key("default", "r1"), 1)
        assert await store.release_own(request_key("default", "r1"), 1)
        loaded = {p.request_id: p for p in await store.load(16, 64)}
        assert len(loaded) == 119 and "r1" not in loaded and loaded["r7"].attempt == 2
    finally:
        await _clean(cluster, namespace)


async def test_the_comparator_joins_and_sweeps_on_a_cluster(cluster: redis.Redis, namespace: str) -> None:
    """Offers, once-only aggregates, the sweep (MULTI) and its counters: all of it in the comparator's one slot."""
    h = Harness(cluster, namespace, shadow_view())
    try:
        await h.comparator.on_result(res("paired"))
        await h.comparator.on_result(res("paired.shadow.exp", shadow=True))
        await h.comparator.on_result(res("paired.shadow.exp", shadow=True))  # redelivered: counted once
        await h.comparator.on_result(res("lonely.shadow.exp", shadow=True))
        assert [c.comparison_id for c in h.published] == ["t:paired:exp"]
        assert (await pair_stats(h)).n == 1
        assert await h.comparator.sweep(now_ms() + 61_000) == {"missing_primary": 1}
        await h.comparator.on_result(res("lonely"))
        assert (await h.store.stats())["late_primary"] == 1
    finally:
        await h.store.drop()
