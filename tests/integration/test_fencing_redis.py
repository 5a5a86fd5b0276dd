"""Fencing by attempt on the real Redis (llmbus.state.fencing): one attempt publishes, zombies cannot."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from llmbus.settings import BusSettings
from llmbus.state.fencing import RequestFence, Superseded
from llmbus.state.store import dispatch_markers
from tests.support import redis_keys

pytestmark = pytest.mark.redis


@pytest.fixture
async def fence(client: redis.Redis) -> AsyncIterator[RequestFence]:
    namespace = f"test-fence-{uuid.uuid4().hex[:10]}"
    yield RequestFence(client, namespace, final_ttl_s=3600, claim_lease_s=5)
    keys = await redis_keys(client, f"llmbus:{namespace}:*")
    if keys:
        await client.delete(*keys)


async def test_one_attempt_claims_the_result_and_a_zombie_cannot(fence: RequestFence) -> None:
    assert await fence.claim_final("r1", 1)
    assert not await fence.claim_final("r1", 2), "SET NX: a second attempt never publishes too"
    assert await fence.claim_final("r1", 1), "attempt 1 redelivered after a crash mid-publish takes it over"
    assert not await fence.superseded("r1", 1) and await fence.superseded("r1", 2)
    await fence.final_published("r1", 1)
    assert not await fence.claim_final("r1", 1), "published: a redelivery of the same attempt is a duplicate"
    assert await fence.superseded("r1", 1)
    assert await fence.holder("r1") == "done:1"


async def test_a_later_attempt_fences_off_the_earlier_ones(fence: RequestFence) -> None:
    assert await fence.supersede("r2", 2) == Superseded.FENCED
    assert await fence.superseded("r2", 1) and not await fence.superseded("r2", 2)
    assert not await fence.claim_final("r2", 1), "the zombie attempt 1 comes back: refused"
    assert await fence.claim_final("r2", 2)
    assert await fence.supersede("r2", 3) == Superseded.RESULT_PENDING  # attempt 2 is publishing
    await fence.final_published("r2", 2)
    assert await fence.supersede("r2", 3) == Superseded.RESULT_OUT


async def test_the_schedulers_final_error_and_an_attempt_exclude_each_other(fence: RequestFence) -> None:
    assert await fence.claim_for_error("r3")
    assert not await fence.claim_final("r3", 1) and await fence.superseded("r3", 5)
    assert await fence.claim_final("r4", 1)
    assert not await fence.claim_for_error("r4"), "the attempt got there first: no second (error) result"


async def test_a_fallback_restarts_attempts_unless_the_result_is_out(fence: RequestFence) -> None:
    assert await fence.supersede("r5", 3) == Superseded.FENCED
    assert await fence.restart("r5") and not await fence.superseded("r5", 1)
    await fence.claim_final("r5", 1)
    assert not await fence.restart("r5")


async def test_markers_are_bounded_in_time(client: redis.Redis, fence: RequestFence) -> None:
    await fence.supersede("r6", 2)
    await fence.claim_final("r6", 2)
    final_key, fence_key = fence._keys("r6")
    assert 0 < await client.pttl(final_key) <= 5_000  # a pending claim is a lease
    await fence.final_published("r6", 2)
    assert 0 < await client.ttl(final_key) <= 3600 and 0 < await client.ttl(fence_key) <= 3600
    # The shared markers take their TTL from settings (LLMBUS_FINAL_MARKER_TTL_S), a day by default.
    assert dispatch_markers(client, "x.").final_ttl_s == BusSettings().final_marker_ttl_s <= 24 * 3600
