"""The gateway's API keys remembered for a bounded time (services/gateway/adapters/key_cache.py), on the real
Redis: a key costs one lookup per cache time, a revoked key stops working once that time is over, a key
that is not found is never remembered, and at most `max_keys` are kept. Through the gateway's HTTP
server: tests/integration/test_gateway_limits.py."""

from __future__ import annotations

import pytest
import redis.asyncio as redis

from llmbus.security.apikeys import ApiKeyStore, key_hash
from llmbus_services.gateway.adapters.key_cache import CachedKeys

pytestmark = pytest.mark.redis


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class CountingStore(ApiKeyStore):
    """The real store, counting its lookups."""

    lookups = 0

    async def lookup_hash(self, digest: str):  # type: ignore[no-untyped-def]
        self.lookups += 1
        return await super().lookup_hash(digest)


async def test_a_key_is_looked_up_once_per_cache_time_and_a_revoked_one_stops_when_it_is_over(
    client: redis.Redis, namespace: str
) -> None:
    store, clock = CountingStore(client, namespace), Clock()
    keys = CachedKeys(store, ttl_s=5.0, clock=clock)
    secret, made = await store.create("acme")
    for _ in range(10):
        found = await keys.lookup(secret)
        assert found is not None and found.tenant == "acme"
        clock.now_s += 0.25  # ten requests over 2.5 s (steps a float holds exactly)
    assert store.lookups == 1
    assert await store.revoke(made.key_id)
    clock.now_s += 2.25  # 4.75 s after the lookup: still within the cache time
    assert await keys.lookup(secret) is not None and store.lookups == 1
    clock.now_s += 0.25  # 5 s after it: looked up again, and refused
    assert await keys.lookup(secret) is None and store.lookups == 2
    assert await keys.lookup(secret) is None and store.lookups == 3, "a refused key is not remembered"


async def test_a_key_made_after_a_miss_works_at_once_and_none_is_kept_with_a_zero_cache_time(
    client: redis.Redis, namespace: str
) -> None:
    store, clock = CountingStore(client, namespace), Clock()
    cached, uncached = CachedKeys(store, ttl_s=5.0, clock=clock), CachedKeys(store, ttl_s=0.0, clock=clock)
    assert await cached.lookup("sk-llmbus-not-a-key") is None
    secret, made = await store.create("acme")
    assert await cached.lookup(secret) is not None
    assert await uncached.lookup(secret) is not None and await uncached.lookup(secret) is not None
    assert store.lookups == 4  # the miss, the cached key once, the uncached one every time
    await store.revoke(made.key_id)
    assert await uncached.lookup(secret) is None


async def test_at_most_max_keys_are_kept_the_oldest_going_first(client: redis.Redis, namespace: str) -> None:
    store, clock = CountingStore(client, namespace), Clock()
    keys = CachedKeys(store, ttl_s=60.0, max_keys=2, clock=clock)
    secrets = [(await store.create(f"t{i}"))[0] for i in range(3)]
    for secret in secrets:
        assert await keys.lookup(secret) is not None
    assert len(keys._found) == 2 and key_hash(secrets[0]) not in keys._found
    assert store.lookups == 3
    assert await keys.lookup(secrets[2]) is not None and store.lookups == 3  # kept
    assert await keys.lookup(secrets[0]) is not None and store.lookups == 4  # gone: looked up again
