"""Request coalescing state in Redis: who leads a cache key, who waits behind whom.

All in Redis (with TTLs), none in a router's memory: the leader's result is read by whichever
router replica owns its llm.results partition, and a follower parked by another replica (or by
a router that has since restarted) is answered all the same.

Keys, under `llmbus:{<namespace>:coalesce}:` (llmbus.state.keys: one hash tag, so on a Redis Cluster
they share one slot) —
  lead:<cache key>       → leader's request id (TTL lead_ttl_s): newcomers with that key follow it
  leading:<leader id>    → its cache key (TTL lead_ttl_s + the followers' park TTL, so it outlives every
                           follower parked behind it): finding the lead key from the leader's result, and
                           telling a result that led nobody, whose followers need no script
  followers:<leader id>  → set of follower request ids
  parked:<follower id>   → the follower's RoutedRequest (JSON): what it is answered or routed as
  waiting                → sorted set follower id → deadline (epoch ms): the sweeper's to-do list
  claim:<follower id>    → who is answering it now (SET NX with a lease)

Joining and finishing are Lua scripts, so a follower either joins before its leader finishes
(and is answered) or after (and finds no leader: it leads itself). Every key a script touches is
named outside it (KEYS): the key that depends on what Redis holds (the leader's followers, the lead
key of a finishing leader) is read first and the script checks it still holds, else it is read again.
A follower is answered once: the relay takes its claim first, and removes it from `waiting` only after
publishing; a relay that dies in between leaves the claim to expire and the sweeper to route the
follower one lease later (the final marker stops a second result if the first went out). Followers
parked under the names from before the hash tag (`llmbus:<namespace>:coalesce:`) are still swept.
"""

from __future__ import annotations

import logging

import redis.asyncio as redis
from prometheus_client import Counter

from llmbus.contract.messages import RoutedRequest, now_ms
from llmbus.state.keys import coalesce_key_root, legacy_coalesce_key_root
from llmbus.state.redis_batch import RedisBatcher
from llmbus.state.text import text_of

log = logging.getLogger(__name__)
COALESCE_JOINS = Counter("llmbus_router_coalesce_joins_total", "Cacheable misses by coalescing role", ["role"])
COALESCE_ERRORS = Counter(
    "llmbus_router_coalesce_errors_total", "Coalescing calls that failed (Redis error); the request is routed alone"
)

# KEYS: lead:<cache key>, waiting, leading:<me>, parked:<me>, followers:<the leader read before>.
# ARGV: me, cache key, lead TTL ms, park TTL ms, wait-until ms, my RoutedRequest, the leader read before
# ("" for none), leading TTL ms. Returns "" (I lead), the leader's id (I follow), or false: the leader changed since it
# was read (its followers' key is another), read it again.
_JOIN = """
local leader = redis.call('GET', KEYS[1])
if (leader or '') ~= ARGV[7] then return false end
if (not leader) or leader == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[8])
  return ''
end
if redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('SET', KEYS[4], ARGV[6], 'PX', ARGV[4])
  redis.call('SADD', KEYS[5], ARGV[1])
  redis.call('PEXPIRE', KEYS[5], ARGV[4])
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
end
return leader
"""

# KEYS: leading:<leader>, lead:<its cache key as read before>, followers:<leader>, waiting.
# ARGV: leader, the cache key read before ("" for none), the followers' new deadline.
# Returns the followers' ids, or false: the leader's cache key changed since it was read.
_FINISH = """
local key = redis.call('GET', KEYS[1])
if (key or '') ~= ARGV[2] then return false end
if key then
  redis.call('DEL', KEYS[1])
  if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
end
local members = redis.call('SMEMBERS', KEYS[3])
redis.call('DEL', KEYS[3])
for _, member in ipairs(members) do
  redis.call('ZADD', KEYS[4], 'XX', ARGV[3], member)
end
return members
"""
READS = 5  # a script refused because what was read changed meanwhile is tried again, this many times


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
        self.namespace = namespace
        self._prefix = coalesce_key_root(namespace)
        self._legacy = legacy_coalesce_key_root(namespace)
        self._lead_ttl_ms = int(lead_ttl_s * 1000)
        self._max_wait_ms = int(max_wait_s * 1000)
        self._park_ttl_ms = self._max_wait_ms + 600_000  # outlives the wait: the sweeper still finds it
        # A follower joins while the lead lives and its followers' set lives a park TTL from its join:
        # `leading` lives longer than both, so a result with no `leading` has nobody behind it.
        self._leading_ttl_ms = self._lead_ttl_ms + self._park_ttl_ms
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
        me = routed.request_key  # leaders and followers by request key: tenant and request id
        try:
            leader = await self._joined(key, me, routed)
        except (redis.RedisError, OSError, RuntimeError):
            COALESCE_ERRORS.inc()  # coalescing is a saving, never a reason to fail a request
            log.warning("coalescing join failed; %s routed alone", routed.request_id, exc_info=True)
            return None
        leader_id = text_of(leader) if leader else None
        COALESCE_JOINS.labels("follow" if leader_id else "lead").inc()
        return leader_id

    async def _joined(self, key: str, me: str, routed: RoutedRequest) -> bytes | str:
        lead = f"{self._prefix}lead:{key}"
        for _ in range(READS):
            seen = text_of(raw) if (raw := await self._client.get(lead)) is not None else ""
            keys = [lead, self._waiting, f"{self._prefix}leading:{me}", f"{self._prefix}parked:{me}"]
            keys.append(f"{self._prefix}followers:{seen or me}")
            args: list[str | int] = [me, key, self._lead_ttl_ms, self._park_ttl_ms, self._wait_until_ms(routed)]
            reply = await self._join(keys, [*args, routed.model_dump_json(), seen, self._leading_ttl_ms])
            if reply is not None:
                return reply  # type: ignore[no-any-return]
        raise RuntimeError(f"the lead of {key} kept changing")

    def _wait_until_ms(self, routed: RoutedRequest) -> int:
        """A follower waits max_wait_s, or until its own deadline: past it, routed alone, the scheduler
        answers deadline_exceeded as it would have without coalescing."""
        wait_until_ms = now_ms() + self._max_wait_ms
        deadline_ms = routed.request.deadline_ms
        return min(wait_until_ms, deadline_ms) if deadline_ms is not None else wait_until_ms

    async def finish(self, leader_id: str) -> list[str]:
        """The leader's result is in: its lead ends, and its followers' ids are handed over (once).

        Their wait is cut to one claim lease: if this caller dies before answering them, the sweeper
        routes them alone soon, not after the whole max_wait_s. A result that led nobody (most: not
        cacheable, a hit, or a follower's) costs one GET and no script."""
        leading = f"{self._prefix}leading:{leader_id}"
        for _ in range(READS):
            key = text_of(raw) if (raw := await self._client.get(leading)) is not None else ""
            if not key:
                return []  # `leading` outlives every follower parked behind it: none wait
            keys = [leading, f"{self._prefix}lead:{key}", f"{self._prefix}followers:{leader_id}", self._waiting]
            members = await self._finish(keys, [leader_id, key, now_ms() + self._claim_lease_ms])
            if members is not None:
                return sorted(text_of(m) for m in members)
        raise RuntimeError(f"the lead of {leader_id} kept changing")

    async def overdue(self, limit: int = 64) -> list[str]:
        """Followers past their wait (their leader's result never came)."""
        due: list[str] = []
        for waiting in (self._waiting, f"{self._legacy}waiting"):
            members = await self._client.zrangebyscore(waiting, "-inf", now_ms(), start=0, num=limit)
            due += [text_of(m) for m in members if isinstance(m, bytes | str)]
        return due[:limit]

    async def claim(self, follower_id: str) -> RoutedRequest | None:
        """The parked follower, if this caller may answer it now; None if answered or being answered."""
        if not await self._client.set(f"{self._prefix}claim:{follower_id}", "1", nx=True, px=self._claim_lease_ms):
            return None
        raw = await self._client.get(f"{self._prefix}parked:{follower_id}")
        if raw is None:  # parked under the names from before the hash tag, or answered already (or expired)
            raw = await self._client.get(f"{self._legacy}parked:{follower_id}")
        if raw is None:
            await self._forget_waiting(follower_id)
            return None
        return RoutedRequest.model_validate_json(raw)

    async def done(self, follower_id: str) -> None:
        """The follower's answer (or its own routed request) is out."""
        # One slot per transaction on a Redis Cluster: the follower's keys, then any from before the tag.
        pipe = self._client.pipeline(transaction=True)
        pipe.zrem(self._waiting, follower_id)
        pipe.delete(f"{self._prefix}parked:{follower_id}")
        await pipe.execute()
        await self._client.delete(f"{self._legacy}parked:{follower_id}")
        await self._client.zrem(f"{self._legacy}waiting", follower_id)

    async def _forget_waiting(self, follower_id: str) -> None:
        await self._client.zrem(self._waiting, follower_id)
        await self._client.zrem(f"{self._legacy}waiting", follower_id)

    async def close(self) -> None:
        await self._client.aclose()
