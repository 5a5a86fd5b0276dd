"""Fencing by attempt on the real Redis (llmbus.state.fencing): one attempt publishes, zombies cannot."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from llmbus.contract.request_key import request_key
from llmbus.settings import BusSettings
from llmbus.state.fencing import FirstClaim, RequestFence, Superseded
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


async def test_a_claim_that_lapsed_unmarked_is_looked_up_before_it_is_fenced(
    client: redis.Redis, fence: RequestFence
) -> None:
    """A claimant that died between its claim and its `done` leaves only `claimed` once its lease runs out:
    its result may be out, so nothing is fenced until the caller has looked for it (and found none)."""
    r7, r8 = request_key("acme", "r7"), request_key("acme", "r8")
    assert (await fence.claim_first(r7, 1, 1_000)).claimed
    await client.delete(fence._keys(r7)[0])  # the pending claim's lease runs out
    assert await fence.supersede(r7, 2) == Superseded.LAPSED
    assert not await fence.superseded(r7, 1), "nothing fenced yet"
    assert await fence.lapsed_claim_ms(r7) == 1_000
    assert await fence.supersede(r7, 2, looked_up=True) == Superseded.FENCED
    assert await fence.superseded(r7, 1) and not await fence.superseded(r7, 2)
    # The next claimant still learns of the earlier claim (and looks for its result itself).
    assert await fence.claim_first(r7, 2, 2_000) == FirstClaim(True, after_earlier=True, earlier_claim_ms=1_000)
    assert await fence.supersede(r7, 3) == Superseded.RESULT_PENDING, "a claim held now has not lapsed"
    await fence.final_published(r7, 2)
    assert await fence.supersede(r7, 3) == Superseded.RESULT_OUT
    # Control: a claim marked done leaves no claim time, so a later placement is fenced at once.
    assert (await fence.claim_first(r8, 1, 1_000)).claimed
    await fence.final_published(r8, 1)
    await client.delete(fence._keys(r8)[0])
    assert await fence.supersede(r8, 2) == Superseded.FENCED


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
