"""RedisBatcher on the real Redis: concurrent calls share a round trip, each keeps its own reply."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis.asyncio as redis
from redis.exceptions import ResponseError

from llmbus.state.redis_batch import RedisBatcher

pytestmark = pytest.mark.redis


@pytest.fixture
def prefix(namespace: str) -> str:
    """Keys under the test's namespace (conftest's `namespace` deletes them afterwards)."""
    return f"llmbus:{namespace}:"


class CountingBatcher(RedisBatcher):
    def __init__(self, client: redis.Redis) -> None:
        super().__init__(client)
        self.round_trips: list[int] = []

    async def _execute(self, batch: list[Any]) -> list[Any]:
        self.round_trips.append(len(batch))
        return await super()._execute(batch)

    async def _alone(self, queue: Any, sha: str | None) -> Any:
        self.round_trips.append(1)
        return await super()._alone(queue, sha)


async def test_concurrent_calls_share_round_trips_and_keep_their_replies(client: redis.Redis, prefix: str) -> None:
    batch = CountingBatcher(client)
    keys = [f"{prefix}k{i}" for i in range(50)]
    claimed = await asyncio.gather(*[batch.call(lambda p, k=k: p.set(k, "v", nx=True, ex=60)) for k in keys])
    assert claimed == [True] * 50
    again = await asyncio.gather(*[batch.call(lambda p, k=k: p.set(k, "w", nx=True, ex=60)) for k in keys[:10]])
    assert again == [None] * 10, "SET NX: taken keys stay taken, each caller sees its own reply"
    assert sum(batch.round_trips) == 60 and len(batch.round_trips) <= 4, batch.round_trips
    assert await client.get(keys[0]) == b"v"


async def test_a_lone_call_goes_at_once(client: redis.Redis, prefix: str) -> None:
    batch = CountingBatcher(client)
    assert await asyncio.wait_for(batch.call(lambda p: p.set(f"{prefix}one", "1")), 5)
    assert batch.round_trips == [1]


async def test_an_error_is_its_callers_only(client: redis.Redis, prefix: str) -> None:
    batch = RedisBatcher(client)
    await client.set(f"{prefix}text", "not a number")
    bad = batch.call(lambda p: p.incr(f"{prefix}text"))
    good = batch.call(lambda p: p.incr(f"{prefix}counter"))
    results = await asyncio.gather(bad, good, return_exceptions=True)
    assert isinstance(results[0], ResponseError) and results[1] == 1


async def test_an_unknown_script_is_loaded_and_only_its_calls_are_sent_again(client: redis.Redis, prefix: str) -> None:
    batch = CountingBatcher(client)
    # A source Redis has never seen (a fresh comment): the first EVALSHA is refused with NOSCRIPT.
    bump = batch.script(f"-- {uuid.uuid4().hex}\nreturn redis.call('INCR', KEYS[1])")
    once = f"{prefix}once"
    replies = await asyncio.gather(
        batch.call(lambda p: p.set(once, "1", nx=True, ex=60)),
        bump([f"{prefix}script"], []),
        bump([f"{prefix}script"], []),
    )
    assert replies == [True, 1, 2], "the SET NX ran once (not sent again), each script call once"
    assert batch.round_trips == [1, 2, 2], "the first call alone at once; the refused two sent again after the load"


async def test_a_lone_script_unknown_to_redis_is_loaded_and_run_once(client: redis.Redis, prefix: str) -> None:
    bump = RedisBatcher(client).script(f"-- {uuid.uuid4().hex}\nreturn redis.call('INCR', KEYS[1])")
    assert await bump([f"{prefix}lone"], []) == 1
    assert await bump([f"{prefix}lone"], []) == 2


async def test_a_refused_script_in_a_batch_does_not_resend_the_others(client: redis.Redis, prefix: str) -> None:
    batch = CountingBatcher(client)
    bump = batch.script(f"-- {uuid.uuid4().hex}\nreturn redis.call('INCR', KEYS[1])")
    first = asyncio.ensure_future(batch.call(lambda p: p.get(f"{prefix}nothing")))
    await asyncio.sleep(0)  # the first call is at Redis: the next two share a round trip
    replies = await asyncio.gather(
        first,
        batch.call(lambda p: p.incr(f"{prefix}plain")),
        bump([f"{prefix}script"], []),
    )
    assert replies == [None, 1, 1], "INCR ran once although its batch was sent again for the script"
    assert batch.round_trips == [1, 2, 1]
