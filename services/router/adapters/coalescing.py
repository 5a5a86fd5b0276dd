"""Request coalescing state in Redis: who leads a cache key, who waits behind whom.

All in Redis (with TTLs), none in a router's memory: the leader's result is read by whichever
router replica owns its llm.results partition, and a follower parked by another replica (or by
a router that has since restarted) is answered all the same.

Keys, under llmbus:<namespace>:coalesce: —
  lead:<cache key>       → leader's request id (TTL lead_ttl_s): newcomers with that key follow it
  leading:<leader id>    → its cache key (same TTL): finding the lead key from the leader's result
  followers:<leader id>  → set of follower request ids
  parked:<follower id>   → the follower's RoutedRequest (JSON): what it is answered or routed as
  waiting                → sorted set follower id → deadline (epoch ms): the sweeper's to-do list
  claim:<follower id>    → who is answering it now (SET NX with a lease)

Joining and finishing are Lua scripts, so a follower either joins before its leader finishes
(and is answered) or after (and finds no leader: it leads itself). A follower is answered once:
the relay takes its claim first, and removes it from `waiting` only after publishing; a relay
that dies in between leaves the claim to expire and the sweeper to route the follower one lease
later (the final marker stops a second result if the first went out).
"""

from __future__ import annotations

import logging

import redis.asyncio as redis
from prometheus_client import Counter

from llmbus.contract.messages import RoutedRequest, now_ms
from llmbus.state.redis_batch import RedisBatcher
from llmbus.state.text import text_of

log = logging.getLogger(__name__)
COALESCE_JOINS = Counter("llmbus_router_coalesce_joins_total", "Cacheable misses by coalescing role", ["role"])
COALESCE_ERRORS = Counter(
    "llmbus_router_coalesce_errors_total", "Coalescing calls that failed (Redis error); the request is routed alone"
)

_JOIN = """
local leader = redis.call('GET', KEYS[1])
if (not leader) or leader == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  redis.call('SET', ARGV[7] .. 'leading:' .. ARGV[1], ARGV[2], 'PX', ARGV[3])
  return ''
end
local parked = ARGV[7] .. 'parked:' .. ARGV[1]
if redis.call('EXISTS', parked) == 0 then
  redis.call('SET', parked, ARGV[6], 'PX', ARGV[4])
  local followers = ARGV[7] .. 'followers:' .. leader
  redis.call('SADD', followers, ARGV[1])
  redis.call('PEXPIRE', followers, ARGV[4])
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
end
return leader
"""

_FINISH = """
local leading = ARGV[2] .. 'leading:' .. ARGV[1]
local key = redis.call('GET', leading)
if key then
  redis.call('DEL', leading)
  local lead = ARGV[2] .. 'lead:' .. key
  if redis.call('GET', lead) == ARGV[1] then redis.call('DEL', lead) end
end
local followers = ARGV[2] .. 'followers:' .. ARGV[1]
local members = redis.call('SMEMBERS', followers)
redis.call('DEL', followers)
for _, member in ipairs(members) do
  redis.call('ZADD', ARGV[2] .. 'waiting', 'XX', ARGV[3], member)
end
return members
"""


class RedisCoalescer:
    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        lead_ttl_s: float = 300.0,
        max_wait_s: float = 330.0,
        claim_lease_s: float = 30.0,
    ) -> None:
        self._client = client
        self._prefix = f"llmbus:{namespace}:coalesce:"
        self._lead_ttl_ms = int(lead_ttl_s * 1000)
        self._max_wait_ms = int(max_wait_s * 1000)
        self._park_ttl_ms = self._max_wait_ms + 600_000  # outlives the wait: the sweeper still finds it
        self._claim_lease_ms = int(claim_lease_s * 1000)
        # Joins and finishes of concurrent requests share Redis round trips (llmbus.state.redis_batch).
        batch = RedisBatcher(client)
        self._join = batch.script(_JOIN)
        self._finish = batch.script(_FINISH)

    @property
    def _waiting(self) -> str:
        return f"{self._prefix}waiting"

    async def join(self, key: str, routed: RoutedRequest) -> str | None:
        """None: lead (route it). Else the leader's id: the request is parked behind it."""
        try:
            leader = await self._join(
                [f"{self._prefix}lead:{key}", self._waiting],
                [
                    routed.request_key,  # leaders and followers by request key: tenant and request id
                    key,
                    self._lead_ttl_ms,
                    self._park_ttl_ms,
                    self._wait_until_ms(routed),
                    routed.model_dump_json(),
                    self._prefix,
                ],
            )
        except (redis.RedisError, OSError):
            COALESCE_ERRORS.inc()  # coalescing is a saving, never a reason to fail a request
            log.warning("coalescing join failed; %s routed alone", routed.request_id, exc_info=True)
            return None
        leader_id = text_of(leader) if leader else None
        COALESCE_JOINS.labels("follow" if leader_id else "lead").inc()
        return leader_id

    def _wait_until_ms(self, routed: RoutedRequest) -> int:
        """A follower waits max_wait_s, or until its own deadline: past it, routed alone, the scheduler
        answers deadline_exceeded as it would have without coalescing."""
        wait_until_ms = now_ms() + self._max_wait_ms
        deadline_ms = routed.request.deadline_ms
        return min(wait_until_ms, deadline_ms) if deadline_ms is not None else wait_until_ms

    async def finish(self, leader_id: str) -> list[str]:
        """The leader's result is in: its lead ends, and its followers' ids are handed over (once).

        Their wait is cut to one claim lease: if this caller dies before answering them, the sweeper
        routes them alone soon, not after the whole max_wait_s."""
        members = await self._finish([], [leader_id, self._prefix, now_ms() + self._claim_lease_ms])
        return sorted(text_of(m) for m in members)

    async def overdue(self, limit: int = 64) -> list[str]:
        """Followers past their wait (their leader's result never came)."""
        members = await self._client.zrangebyscore(self._waiting, "-inf", now_ms(), start=0, num=limit)
        return [text_of(m) for m in members if isinstance(m, bytes | str)]

    async def claim(self, follower_id: str) -> RoutedRequest | None:
        """The parked follower, if this caller may answer it now; None if answered or being answered."""
        if not await self._client.set(f"{self._prefix}claim:{follower_id}", "1", nx=True, px=self._claim_lease_ms):
            return None
        raw = await self._client.get(f"{self._prefix}parked:{follower_id}")
        if raw is None:  # answered already (or expired): nothing left to do for it
            await self._client.zrem(self._waiting, follower_id)
            return None
        return RoutedRequest.model_validate_json(raw)

    async def done(self, follower_id: str) -> None:
        """The follower's answer (or its own routed request) is out."""
        pipe = self._client.pipeline(transaction=True)
        pipe.zrem(self._waiting, follower_id)
        pipe.delete(f"{self._prefix}parked:{follower_id}")
        await pipe.execute()

    async def close(self) -> None:
        await self._client.aclose()
