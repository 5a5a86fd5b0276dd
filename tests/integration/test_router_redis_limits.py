"""Token buckets on the real Redis: atomic, shared, refusing with a usable retry_after."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as redis

from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_services.router.adapters.limits import RedisRateLimiter
from llmbus_services.router.core.config import TenantPolicy
from tests.support import redis_keys

pytestmark = pytest.mark.redis


async def _cleanup(client: redis.Redis, namespace: str) -> None:
    keys = await redis_keys(client, f"llmbus:{namespace}:*")
    if keys:
        await client.delete(*keys)


async def test_request_burst_then_refusal_with_retry_after(client: redis.Redis, namespace: str) -> None:
    limiter = RedisRateLimiter(client, namespace)
    limits = TenantPolicy(requests_per_s=2, burst_requests=5, tokens_per_min=1_000_000)
    try:
        verdicts = [await limiter.take("acme", limits, 10) for _ in range(8)]
        assert [v.allowed for v in verdicts] == [True] * 5 + [False] * 3
        refused = verdicts[-1]
        assert refused.limit == "requests" and refused.retry_after_ms is not None
        assert 0 < refused.retry_after_ms <= 500  # one request refills in 1/2 s
        # Another tenant has its own bucket.
        assert (await limiter.take("globex", limits, 10)).allowed
        await asyncio.sleep(refused.retry_after_ms / 1000 + 0.05)
        assert (await limiter.take("acme", limits, 10)).allowed
    finally:
        await _cleanup(client, namespace)


async def test_tokens_per_minute_and_refusal_takes_nothing(client: redis.Redis, namespace: str) -> None:
    limiter = RedisRateLimiter(client, namespace)
    limits = TenantPolicy(requests_per_s=1000, burst_requests=1000, tokens_per_min=6000)  # 100 tokens/s
    try:
        assert (await limiter.take("acme", limits, 5000)).allowed
        refused = await limiter.take("acme", limits, 2000)
        assert not refused.allowed and refused.limit == "tokens"
        assert refused.retry_after_ms is not None and 8_000 <= refused.retry_after_ms <= 10_000  # ~1000 tokens short
        # The refusal did not take the tokens: a request that fits still passes.
        assert (await limiter.take("acme", limits, 900)).allowed
        too_big = await limiter.take("acme", limits, 7000)
        assert not too_big.allowed and too_big.retry_after_ms is None  # never fits in a minute
    finally:
        await _cleanup(client, namespace)


async def test_concurrent_takes_never_overspend(client: redis.Redis, namespace: str) -> None:
    """Two limiter instances on two connections pools (two router replicas) racing on one tenant:
    exactly the burst gets through."""
    other = redis_client(BusSettings().redis_url)
    a, b = RedisRateLimiter(client, namespace), RedisRateLimiter(other, namespace)
    limits = TenantPolicy(requests_per_s=0.01, burst_requests=50, tokens_per_min=10_000_000)
    try:
        verdicts = await asyncio.gather(*[(a if i % 2 else b).take("acme", limits, 1) for i in range(160)])
        assert sum(v.allowed for v in verdicts) == 50
        ttl_ms = await client.pttl(limiter_keys(a, "acme")[0])
        assert ttl_ms > 0  # idle buckets expire
    finally:
        await other.aclose()
        await _cleanup(client, namespace)


def limiter_keys(limiter: RedisRateLimiter, tenant: str) -> list[str]:
    return limiter.keys(tenant)
