"""Fixtures the Redis-backed integration tests share: a client of the local Redis or of the private Redis
Cluster, a key namespace, and a topic prefix for tests of services' own key layouts."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from tests.support import drop_keys, redis_keys


@pytest.fixture
async def client(redis_up: None) -> AsyncIterator[redis.Redis]:
    """A client of the local Redis (`make test` starts it)."""
    c = redis_client(BusSettings().redis_url)
    await c.ping()
    yield c
    await c.aclose()


@pytest.fixture
async def namespace(client: redis.Redis) -> AsyncIterator[str]:
    """A fresh namespace (keys `llmbus:<namespace>:...`); its keys are deleted afterwards."""
    ns = f"test-{uuid.uuid4().hex[:10]}"
    yield ns
    keys = await redis_keys(client, f"llmbus:{ns}:*") + await redis_keys(client, f"llmbus:{{{ns}:*")  # and tagged
    if keys:
        await client.delete(*keys)


@pytest.fixture
async def cluster(redis_cluster: str) -> AsyncIterator[redis.Redis]:
    """A client of the private 3-master Redis Cluster, as the services make one (LLMBUS_REDIS_CLUSTER=true)."""
    c = redis_client(redis_cluster, cluster=True)
    assert isinstance(c, redis.RedisCluster)
    await c.initialize()
    assert len(c.get_primaries()) == 3
    yield c
    await c.aclose()


async def _prefix_on(client: redis.Redis) -> AsyncIterator[str]:
    """A fresh topic prefix (`t<hex>.`); afterwards every key that names it goes, whatever its layout."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    yield prefix
    await drop_keys(client, f"*{prefix}*")


@pytest.fixture
async def local_prefix(client: redis.Redis) -> AsyncIterator[str]:
    """A topic prefix for tests of services' own key layouts on the local Redis."""
    async for prefix in _prefix_on(client):
        yield prefix


@pytest.fixture
async def cluster_prefix(cluster: redis.Redis) -> AsyncIterator[str]:
    """A topic prefix for tests of services' own key layouts on the private Redis Cluster."""
    async for prefix in _prefix_on(cluster):
        yield prefix
