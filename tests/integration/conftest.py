"""Fixtures the Redis-backed integration tests share: a client of the local Redis and a key namespace."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from tests.support import redis_keys


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
    keys = await redis_keys(client, f"llmbus:{ns}:*")
    if keys:
        await client.delete(*keys)
