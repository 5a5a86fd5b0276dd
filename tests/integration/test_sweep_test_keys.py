"""make test's sweep drops the Redis keys earlier runs' test namespaces left, and nothing else."""

from __future__ import annotations

import uuid

import pytest

from llmbus.state.store import redis_client
from llmbus.state.text import text_of
from llmbus_tools.harness.service_procs import drop_test_keys, fresh_settings

# A logical database of its own: the sweep walks a whole database, and the suite's other tests (on
# database 0 beside this one) keep their keys while it runs.
URL = "redis://127.0.0.1:6379/7"


@pytest.mark.asyncio
async def test_the_sweep_drops_test_namespace_keys_and_keeps_the_rest(redis_up: None) -> None:
    client = redis_client(URL)
    try:
        await client.flushdb()
        prefix = fresh_settings().topic_prefix
        batches = [f"llmbus:{prefix}worker:{{r:t:{n}}}:final" for n in range(1500)]  # more than one delete
        doomed = [*batches, f"{prefix}cost:seen:tenant-0:r-1", f"llmbus:test-{uuid.uuid4().hex[:10]}:placement:r-1"]
        kept = ["llmbus:worker:{r:acme:r-1}:final", "llmbus:apikey:abc", "tenant.cost:seen:acme:r-1"]
        async with client.pipeline(transaction=False) as pipe:
            for key in doomed + kept:
                pipe.set(key, b"1", ex=3600)
            await pipe.execute()

        assert await drop_test_keys(URL, batch=1000) == len(doomed)

        assert sorted(text_of(k) for k in await client.keys("*")) == sorted(kept)
    finally:
        await client.flushdb()
        await client.aclose()
