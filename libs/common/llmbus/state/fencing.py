"""Fencing by attempt: of all the attempts a request may get, only one publishes its final result.

Two Redis keys per request, shared by the scheduler and the workers, each changed only by
a Lua script so every check-and-set is one atomic step. Both are `llmbus:<namespace>:{r:<tenant>:<request id>}:<kind>`
(the request's `RequestKey`: two tenants' requests of one id are two requests, each with its own one result);
the hash tag keeps them in one Redis Cluster slot, as a script over both needs.

Markers written before the tenant was part of the key (`{r:<request id>}`) are not read. During a
rolling upgrade a Dispatch redelivered across the change, or a worker of the old version beside
one of the new, could publish a second result for a request in flight then: upgrade the scheduler
and every worker together once `llm.dispatch` is drained. The old markers expire with their TTL.

- `fence:<request id>` — the highest attempt the scheduler placed. An attempt below it is
  superseded: its worker stops (checked before it starts and again while it runs) and may not
  publish. The scheduler raises the fence before it sends a new attempt (`supersede`), and
  refuses to when the final marker is already taken (the old attempt is publishing or has).
- `final:<request id>` — who publishes the final result. A worker claims it with SET NX
  carrying its attempt (`pending:<attempt>`, with a lease) just before it publishes, and marks it
  `done:<attempt>` after. A redelivered Dispatch of the same attempt may take over its own
  pending claim (the worker died between claim and publish). The scheduler's final errors
  (deadline, max attempts) take it as `done:scheduler` and raise the fence past every attempt.
- `claimed:<request id>` — when a worker first claimed the result (ms), kept until `done` is set.
  A claim that finds it took over from a claimant that never marked `done`: one that died, or whose
  lease lapsed, between its claim and its mark, so its result may be out. `claim_first` says so,
  and the worker reads `llm.results` from that time before it publishes (engine_worker's ending).
  `supersede` says so too (LAPSED, nothing fenced): the scheduler reads `llm.results` from that time
  and sends no later attempt where the result is out.

The one window left: an attempt whose pending claim is older than the lease may be superseded
while its (very late) publish is still under way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

import redis.asyncio as redis

from llmbus.contract.request_key import RequestKey
from llmbus.state.redis_batch import RedisBatcher
from llmbus.state.text import text_of

log = logging.getLogger(__name__)

# Both claims start here. KEYS: final, fence. ARGV: attempt, lease_ms. Not yours (a later attempt's
# fence, or another's marker): 0. Otherwise the pending claim is (re)taken; `cur` is what it replaced.
_TAKE_PENDING = """
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if fence > tonumber(ARGV[1]) then return 0 end
local mine = 'pending:' .. ARGV[1]
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= mine then return 0 end
redis.call('SET', KEYS[1], mine, 'PX', ARGV[2])
"""

# KEYS: final, fence. ARGV: attempt, lease_ms. 1: claimed (publish now), 0: not yours.
_CLAIM = _TAKE_PENDING + "return 1\n"

# KEYS: final, fence, claimed. ARGV: attempt, lease_ms, now_ms, ttl_s. 0: not yours; -1: claimed, and
# nobody claimed before; 1: claimed over a pending claim of this attempt with no time kept; t > 1:
# claimed, and an earlier claim taken at t ms never marked done (its result may be out).
_CLAIM_FIRST = (
    _TAKE_PENDING
    + """
local earlier = redis.call('GET', KEYS[3])
if earlier then return tonumber(earlier) end
redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[4])
if cur then return 1 end
return -1
"""
)

# KEYS: final, claimed. ARGV: done value, ttl_s. The result is out: its marker, and no claim time left.
_DONE = """
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('DEL', KEYS[2])
return 1
"""

# KEYS: final, fence, claimed. ARGV: attempt, ttl_s, looked_up. 1: the fence stands at `attempt`; 0: the
# result is out; 2: an earlier attempt holds a pending claim (it is publishing, or died doing so: its lease
# will tell); 3: nothing fenced, a claim lapsed unmarked (its result may be out), unless `looked_up` is 1.
_SUPERSEDE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  if string.sub(cur, 1, 8) == 'pending:' then return 2 end
  return 0
end
if ARGV[3] ~= '1' and redis.call('EXISTS', KEYS[3]) == 1 then return 3 end
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if fence < tonumber(ARGV[1]) then redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2]) end
return 1
"""

# KEYS: final, fence, claimed. ARGV: ttl_s, beyond-every-attempt. 1: the scheduler's error is the final result.
_CLAIM_FOR_ERROR = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], 'done:scheduler', 'EX', ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[1])
redis.call('DEL', KEYS[3])
return 1
"""

# KEYS: final, fence. 1: the fence is gone (attempts count from 1 again), 0: the result is taken.
_RESTART = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2])
return 1
"""

_EVERY_ATTEMPT = 2**31


@dataclass(frozen=True)
class FirstClaim:
    """`claim_first`'s answer. `after_earlier`: an earlier claimant never marked the result done, so it
    may be out; `earlier_claim_ms` is when that claim was taken (None: not known, only that it was
    this attempt's, so no earlier than this attempt's dispatch)."""

    claimed: bool
    after_earlier: bool = False
    earlier_claim_ms: int | None = None


class Superseded(IntEnum):
    RESULT_OUT = 0  # an earlier attempt (or the scheduler) published the result: nothing to place
    FENCED = 1  # earlier attempts are fenced off: send the new one
    RESULT_PENDING = 2  # an earlier attempt claimed the result and has not marked it done: ask again later
    LAPSED = 3  # an earlier claim lapsed before it was marked done: look for its result, then supersede again


class RequestFence:
    def __init__(
        self, client: redis.Redis, namespace: str, final_ttl_s: int = 24 * 3600, claim_lease_s: float = 30.0
    ) -> None:
        self._client = client
        self._namespace = namespace
        self.final_ttl_s = final_ttl_s
        self.claim_lease_ms = int(claim_lease_s * 1000)
        # Every call goes through one batcher: the concurrent attempts of a worker (or requests of
        # a scheduler) share Redis round trips instead of making one each.
        self._batch = RedisBatcher(client)
        self._claim = self._batch.script(_CLAIM)
        self._claim_first = self._batch.script(_CLAIM_FIRST)
        self._done = self._batch.script(_DONE)
        self._supersede = self._batch.script(_SUPERSEDE)
        self._claim_for_error = self._batch.script(_CLAIM_FOR_ERROR)
        self._restart = self._batch.script(_RESTART)

    def _keys(self, key: RequestKey) -> list[str]:
        # One hash tag for both ({r:<tenant>:<request id>}), so each script's keys share a Redis Cluster
        # slot. The kind follows the tag: whatever braces an id holds, both keys hash the same text, and
        # the "r:" keeps that text non-empty (an empty tag would hash each whole key apart).
        base = f"llmbus:{self._namespace}:{{r:{key}}}"
        return [f"{base}:final", f"{base}:fence"]

    def _claimed_key(self, key: RequestKey) -> str:
        return f"llmbus:{self._namespace}:{{r:{key}}}:claimed"

    async def superseded(self, key: RequestKey, attempt: int) -> bool:
        """True when this attempt may no longer run: a later one was placed, or another owns the result."""
        keys = self._keys(key)
        final, fence = await self._batch.call(lambda pipe: _mget(pipe, keys))
        if fence is not None and int(fence) > attempt:
            return True
        return final is not None and final != f"pending:{attempt}".encode()

    async def claim_final(self, key: RequestKey, attempt: int) -> bool:
        """Take the right to publish the final result (call just before publishing it)."""
        return bool(await self._claim(self._keys(key), [attempt, self.claim_lease_ms]))

    async def claim_first(self, key: RequestKey, attempt: int, now_ms: int) -> FirstClaim:
        """A worker's first claim of the result: refused, fresh, or over an earlier claim never marked done."""
        keys = [*self._keys(key), self._claimed_key(key)]
        answer = int(await self._claim_first(keys, [attempt, self.claim_lease_ms, now_ms, self.final_ttl_s]))
        if answer == 0:
            return FirstClaim(claimed=False)
        if answer == -1:
            return FirstClaim(claimed=True)
        return FirstClaim(claimed=True, earlier_claim_ms=answer if answer > 1 else None, after_earlier=True)

    async def final_published(self, key: RequestKey, attempt: int) -> None:
        await self._done([self._keys(key)[0], self._claimed_key(key)], [f"done:{attempt}", self.final_ttl_s])

    async def supersede(self, key: RequestKey, attempt: int, looked_up: bool = False) -> Superseded:
        """Before sending `attempt` (> 1): fence off the earlier ones, unless one owns the result, or (LAPSED)
        one claimed it and lapsed unmarked. `looked_up`: that claim's result was looked for and is not out."""
        keys = [*self._keys(key), self._claimed_key(key)]
        return Superseded(int(await self._supersede(keys, [attempt, self.final_ttl_s, int(looked_up)])))

    async def claim_for_error(self, key: RequestKey) -> bool:
        """The scheduler's final error: True if it is the result (no attempt claimed one first)."""
        keys = [*self._keys(key), self._claimed_key(key)]
        return bool(await self._claim_for_error(keys, [self.final_ttl_s, _EVERY_ATTEMPT]))

    async def lapsed_claim_ms(self, key: RequestKey) -> int | None:
        """When a claim nobody holds any more was taken (no final marker, but its time kept): its
        claimant died or stalled between claiming and marking done, so its result may be out. None
        when there is none (no claim yet, a claim held now, or the result marked)."""
        keys = [self._keys(key)[0], self._claimed_key(key)]
        final, claimed = await self._batch.call(lambda pipe: _mget(pipe, keys))
        return int(claimed) if final is None and claimed is not None else None

    async def restart(self, key: RequestKey) -> bool:
        """A fallback to another model starts its attempts at 1 again; False: the result is taken."""
        return bool(await self._restart(self._keys(key), []))

    async def holder(self, key: RequestKey) -> str | None:
        """The final marker's value (`pending:<attempt>`, `done:<attempt>`, `done:scheduler`), for tests and tools."""
        final = self._keys(key)[0]
        value = await self._batch.call(lambda pipe: pipe.get(final))
        return None if value is None else text_of(value)


class Claimant(Protocol):
    claim_lease_ms: int

    async def claim_final(self, key: RequestKey, attempt: int) -> bool: ...


def claim_kept(fence: Claimant, key: RequestKey, attempt: int) -> contextlib.AbstractAsyncContextManager[None]:
    """The pending claim renewed (every third of its lease) while the body publishes the result.

    A publish that rides out a broker restart outlives the lease; an expired claim would let the
    scheduler place another attempt, whose result would be the second one.
    """
    return _ClaimKept(fence, key, attempt)


class _ClaimKept(contextlib.AbstractAsyncContextManager[None]):
    # A timer, not a task, until the first renewal is due: nearly every publish is over long before,
    # and a task per request (started, cancelled, awaited) is most of what this would cost.
    def __init__(self, fence: Claimant, key: RequestKey, attempt: int) -> None:
        self._fence = fence
        self._key = key
        self._attempt = attempt
        self._timer: asyncio.TimerHandle | None = None
        self._renewing: asyncio.Task[None] | None = None

    async def __aenter__(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self._fence.claim_lease_ms / 3000, self._start_renewing)

    async def __aexit__(self, *_: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._renewing is not None:
            self._renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewing

    def _start_renewing(self) -> None:
        self._renewing = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        fence, key, attempt = self._fence, self._key, self._attempt
        while True:
            try:
                if not await fence.claim_final(key, attempt):
                    log.error("%s:%d: the claim was lost while its result was being published", key, attempt)
                    return
            except Exception:  # Redis away too: try again while the lease lasts
                log.warning("%s:%d: could not renew the claim", key, attempt, exc_info=True)
            await asyncio.sleep(fence.claim_lease_ms / 3000)


def _mget(pipe: Any, keys: list[str]) -> Any:
    """MGET queued on a batch's pipeline. execute_command, not mget(): a cluster pipeline refuses the named
    method (redis-py blocks it even for keys of one slot), yet routes MGET by its keys like any command (a
    request's keys share a hash tag: one node answers). A lone call runs on the client, where mget() works,
    so the refusal showed only when calls overlapped, under load."""
    return pipe.execute_command("MGET", *keys)
