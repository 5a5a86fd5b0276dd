"""The comparator's Redis state: pending pair sides, once-only aggregate updates, join counters.

Keys (all under `llmbus:<namespace>:{comparator}:`: the one hash tag keeps them in one Redis Cluster
slot, as the scripts need -- an offer touches its pair and the shared `pending` set):
  pair:<primary key>       hash: `p` (primary result JSON) and `s:<experiment>` (shadow result
                           JSON) while the partner is awaited; TTL `pair_ttl_s`
  pending                  zset of primary keys by deadline (ms): the sweeper finds expired pairs
  gone:<primary key>       the pair was swept: a partner arriving now is `late`; TTL `done_ttl_s`
  done:<kind>:<id>         an effect (a pair, a result, a cost, a feedback) was counted; TTL `done_ttl_s`
  agg:<exp>:<step>:<var>   mergeable aggregate hash (core/aggregates.py)
  req:<request key>        "<exp>|<step>|<variant>|<tenant>" of an A/B result, to join costs and feedback
                           (feedback counts only from the result's own tenant)
A request key is `<tenant>:<request id>` (llmbus.contract.request_key): two tenants' requests with the same
id never share a pair, a link or a once-only mark (a pair's is `<primary key>:<experiment>`, a
result's, cost's or feedback's its request key).
  stats                    join counters (pairs, duplicate, late, missing_primary, ...)

Every once-only effect is one Lua script: `SET done NX` and the HINCRBYFLOATs happen
together or not at all, so a redelivered record after a crash counts nothing twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import redis.asyncio as redis

from llmbus.state.text import text_of
from llmbus_services.shadow_comparator.core.aggregates import Increments
from llmbus_services.shadow_comparator.core.ports import RequestLink

# KEYS: pair, pending, gone, done ; ARGV: field, value, ttl_s, deadline_ms, primary id, only if a side waits (1|0)
_OFFER = """
if redis.call('EXISTS', KEYS[4]) == 1 then return {'done'} end
if redis.call('EXISTS', KEYS[3]) == 1 then return {'late'} end
if ARGV[6] == '1' and redis.call('EXISTS', KEYS[1]) == 0 then return {'skip'} end
local status = 'new'
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then status = 'dup' end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], 'NX', ARGV[4], ARGV[5])
local out = {status}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do out[#out + 1] = all[i] end
return out
"""

# KEYS: done, agg, [pair] ; ARGV: done_ttl_s, field_to_delete|'', k1, v1, k2, v2, ...
_APPLY_ONCE = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
for i = 3, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[2], ARGV[i], ARGV[i + 1]) end
if KEYS[3] and ARGV[2] ~= '' then
  redis.call('HDEL', KEYS[3], ARGV[2])
  redis.call('HSET', KEYS[3], 'paired', '1')
end
return 1
"""


Arg = bytes | str | int | float


class ComparatorStore:
    def __init__(
        self, client: redis.Redis, namespace: str, pair_ttl_s: int = 600, done_ttl_s: int = 7 * 24 * 3600
    ) -> None:
        self._r = client
        self._ns = f"llmbus:{namespace}:{{comparator}}"
        self.pair_ttl_s = pair_ttl_s
        self.done_ttl_s = done_ttl_s
        self._offer = client.register_script(_OFFER)
        self._apply_once = client.register_script(_APPLY_ONCE)

    def key(self, *parts: object) -> str:
        return ":".join([self._ns, *map(str, parts)])

    async def offer(
        self,
        primary_key: str,
        field: str,
        value: bytes,
        now_ms: int,
        done_id: str | None,
        only_if_waiting: bool = False,
    ) -> tuple[str, dict[str, bytes]]:
        """Store one side; returns (new | dup | late | done | skip, every side now held for this primary).
        `only_if_waiting`: stored only when a side of its pair is held already, else `skip`."""
        reply = await self._offer(
            keys=[
                self.key("pair", primary_key),
                self.key("pending"),
                self.key("gone", primary_key),
                self.key("done", "pair", done_id) if done_id else self.key("done", "never"),
            ],
            args=[field, value, self.pair_ttl_s, now_ms + self.pair_ttl_s * 1000, primary_key, int(only_if_waiting)],
        )
        status = text_of(reply[0])
        fields = {text_of(reply[i]): reply[i + 1] for i in range(1, len(reply) - 1, 2)}
        return status, fields

    async def apply_once(
        self, done_kind: str, done_id: str, agg_key: str, increments: Increments, settle: tuple[str, str] | None = None
    ) -> bool:
        """Add `increments` to `agg_key` unless `done:<kind>:<id>` exists; optionally settle a pair side."""
        keys = [self.key("done", done_kind, done_id), agg_key]
        args: list[Arg] = [self.done_ttl_s, ""]
        if settle is not None:
            keys.append(self.key("pair", settle[0]))
            args[1] = settle[1]
        for k, v in increments.items():
            args += [k, repr(float(v))]
        return bool(await self._apply_once(keys=keys, args=args))

    def agg_key(self, experiment_id: str, step: int, variant: str) -> str:
        return self.key("agg", experiment_id, step, variant)

    async def read_agg(self, experiment_id: str, step: int, variant: str) -> dict[str, float]:
        raw = await self._r.hgetall(self.agg_key(experiment_id, step, variant))
        return {text_of(k): float(v) for k, v in raw.items()}

    async def remember_request(
        self, request_key: str, experiment_id: str, step: int, variant: str, tenant: str
    ) -> None:
        link = f"{experiment_id}|{step}|{variant}|{tenant}"
        await self._r.set(self.key("req", request_key), link, ex=self.done_ttl_s)

    async def request_variant(self, request_key: str, request_id: str) -> RequestLink | None:
        """The link of the request `request_key`, else one stored under its bare id (`req:<request id>`,
        by a comparator from before request keys: its tenant field says whose it was)."""
        raw, legacy = await self._r.mget([self.key("req", request_key), self.key("req", request_id)])
        raw = raw if raw is not None else legacy
        if raw is None:
            return None
        exp, step, variant, *tenant = text_of(raw).split("|", 3)
        return RequestLink(exp, int(step), variant, tenant[0] if tenant else None)

    async def count(self, **counters: int) -> None:
        pipe = self._r.pipeline(transaction=False)
        for name, n in counters.items():
            pipe.hincrby(self.key("stats"), name, n)
        await pipe.execute()

    async def stats(self) -> dict[str, int]:
        raw = await self._r.hgetall(self.key("stats"))
        return {text_of(k): int(v) for k, v in raw.items()}

    async def due(self, now_ms: int, limit: int = 500) -> list[str]:
        return [text_of(m) for m in await self._r.zrangebyscore(self.key("pending"), "-inf", now_ms, 0, limit)]

    async def sweep_one(self, primary_key: str) -> dict[str, bytes] | None:
        """Remove an expired pair (once: the zset removal decides who sweeps it); its leftover sides."""
        if not await self._r.zrem(self.key("pending"), primary_key):
            return None
        pipe = self._r.pipeline(transaction=True)
        pipe.hgetall(self.key("pair", primary_key))
        pipe.delete(self.key("pair", primary_key))
        pipe.set(self.key("gone", primary_key), "1", ex=self.done_ttl_s)
        fields, _, _ = await pipe.execute()
        return {text_of(k): v for k, v in fields.items()}

    async def lead(self, owner: str, ttl_s: float) -> bool:
        """True while `owner` holds the decision lease: one instance decides, however many compare."""
        key = self.key("decider")
        if await self._r.set(key, owner, nx=True, px=int(ttl_s * 1000)):
            return True
        if text_of(await self._r.get(key)) == owner:
            await self._r.pexpire(key, int(ttl_s * 1000))
            return True
        return False

    async def drop(self) -> None:
        """Delete every key of this namespace (tests and throw-away stacks)."""
        keys = [k async for k in self._r.scan_iter(match=f"{self._ns}:*")]
        if keys:
            await self._r.delete(*keys)

    async def close(self) -> None:
        await self._r.aclose()


def decode_fields(fields: Mapping[str, bytes]) -> dict[str, dict[str, object]]:
    return {k: json.loads(v) for k, v in fields.items() if k == "p" or k.startswith("s:")}
