"""Redis state of cost-accounting: dedupe markers, pending self-hosted results, ledger cursors,
aggregates and budget alerts. Every key carries the namespace (topic prefix) and a TTL where it can grow."""

from __future__ import annotations

import json

import redis.asyncio as redis
from redis.typing import EncodableT, FieldT

from llmbus.messages import CostRecord, InferenceResult
from llmbus.state import text_of
from services.cost_accounting.core.aggregates import TTL_S, batch_increments, increments

# A cost record is applied once: its marker and its increments in one atomic step.
_APPLY = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) == false then return 0 end
local n = (#ARGV - 1) / 4
for i = 0, n - 1 do
  local key, field, by, ttl = ARGV[2 + 4*i], ARGV[3 + 4*i], ARGV[4 + 4*i], ARGV[5 + 4*i]
  redis.call('HINCRBY', key, field, by)
  if redis.call('TTL', key) < 0 then redis.call('EXPIRE', key, ttl) end
end
return 1
"""

# A whole batch of cost records applied in one atomic step: all its markers and the batch's summed
# increments, or nothing (a marker already there: someone applied one of them; the caller falls back
# to _APPLY record by record). KEYS: the markers. ARGV: marker TTL, then per hash key: key, TTL,
# number of fields, then field, increment pairs.
_APPLY_BATCH = """
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 0 end
end
for i = 1, #KEYS do redis.call('SET', KEYS[i], '1', 'EX', ARGV[1]) end
local at = 2
while at <= #ARGV do
  local key, ttl, n = ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2])
  at = at + 3
  for j = 0, n - 1 do redis.call('HINCRBY', key, ARGV[at + 2*j], ARGV[at + 2*j + 1]) end
  at = at + 2 * n
  if redis.call('TTL', key) < 0 then redis.call('EXPIRE', key, ttl) end
end
return 1
"""

# Results' dedupe markers, all of a batch in one command (SET has no multi-key form with a TTL).
_MARK = """
for i = 1, #KEYS do redis.call('SET', KEYS[i], '1', 'EX', ARGV[1]) end
return #KEYS
"""


class CostStore:
    def __init__(self, client: redis.Redis, namespace: str, dedupe_ttl_s: int) -> None:
        self.client = client
        self.ns = namespace
        self.ttl_s = dedupe_ttl_s
        self._apply = client.register_script(_APPLY)
        self._apply_batch = client.register_script(_APPLY_BATCH)
        self._mark = client.register_script(_MARK)

    def _seen(self, request_id: str) -> str:
        return f"{self.ns}cost:seen:{request_id}"

    def _pending(self, worker_id: str) -> str:
        return f"{self.ns}cost:pending:{worker_id}"

    # -- results: billed once -----------------------------------------------------------------
    async def seen(self, request_ids: list[str]) -> list[bool]:
        """One MGET for the batch (one command with n keys packs far cheaper than n commands)."""
        if not request_ids:
            return []
        return [v is not None for v in await self.client.mget([self._seen(rid) for rid in request_ids])]

    async def mark_seen(self, request_ids: list[str]) -> None:
        if request_ids:
            await self._mark(keys=[self._seen(rid) for rid in request_ids], args=[self.ttl_s])

    async def hold(self, results: list[InferenceResult]) -> None:
        """Self-hosted results wait for their intervals: held durably and marked seen together (MULTI)."""
        if not results:
            return
        by_worker: dict[str, dict[FieldT, EncodableT]] = {}
        for r in results:
            by_worker.setdefault(self._pending(r.worker_id or ""), {})[r.request_id] = r.model_dump_json()
        async with self.client.pipeline(transaction=True) as pipe:
            for key, held in by_worker.items():
                pipe.hset(key, mapping=held)
                pipe.expire(key, self.ttl_s)
            await self._mark(keys=[self._seen(r.request_id) for r in results], args=[self.ttl_s], client=pipe)
            await pipe.execute()

    async def release(self, records: list[CostRecord], cursors: dict[str, dict[str, int | bool]]) -> None:
        """After the ledger's records are published: drop them from pending, save the cursors."""
        done: dict[str, list[str]] = {}
        for r in records:
            if r.worker_id and r.kind == "self_hosted":
                done.setdefault(self._pending(r.worker_id), []).append(r.request_id)
        async with self.client.pipeline(transaction=True) as pipe:
            for key, request_ids in done.items():  # one HDEL per worker, not one per record
                pipe.hdel(key, *request_ids)
            for worker_id, cursor in cursors.items():
                pipe.hset(f"{self.ns}cost:cursor", worker_id, json.dumps(cursor))
            await pipe.execute()

    async def load_held(self) -> tuple[list[InferenceResult], dict[str, dict[str, int | bool]]]:
        held: list[InferenceResult] = []
        async for key in self.client.scan_iter(match=f"{self.ns}cost:pending:*", count=500):
            for raw in (await self.client.hgetall(key)).values():
                held.append(InferenceResult.model_validate_json(raw))
        cursors = {text_of(k): json.loads(v) for k, v in (await self.client.hgetall(f"{self.ns}cost:cursor")).items()}
        return held, cursors

    # -- aggregates -----------------------------------------------------------------------------
    async def apply(self, records: list[CostRecord]) -> list[bool]:
        """Add each record to the aggregates once (by record id); True where it was new.

        The common case in two round trips whatever the batch size: which markers exist (MGET),
        then the new records' markers and their summed increments in one atomic script. Only if a
        marker appeared in between (another consumer applied one) does it go record by record.
        """
        if not records:
            return []
        markers = [self._applied(r.record_id) for r in records]
        present = [v is not None for v in await self.client.mget(markers)]
        first: dict[str, int] = {}  # marker -> index of its first new record (twice in a batch counts once)
        for i, (marker, was_applied) in enumerate(zip(markers, present, strict=True)):
            if not was_applied:
                first.setdefault(marker, i)
        if not first:
            return [False] * len(records)
        args: list[str | int] = [self.ttl_s]
        for key, fields in batch_increments([records[i] for i in first.values()], self.ns).items():
            args += [key, TTL_S[_period_of(key)], len(fields)]
            for field, by in fields.items():
                args += [field, by]
        if await self._apply_batch(keys=list(first), args=args):
            new = set(first.values())
            return [i in new for i in range(len(records))]
        return await self.apply_one_by_one(records)

    def _applied(self, record_id: str) -> str:
        return f"{self.ns}cost:applied:{record_id}"

    async def apply_one_by_one(self, records: list[CostRecord]) -> list[bool]:
        """Each record with its own marker and increments in one script: the slow, always-correct path."""
        async with self.client.pipeline(transaction=False) as pipe:
            for record in records:
                args: list[str | int] = [self.ttl_s]
                for key, field, by in increments(record, self.ns):
                    args += [key, field, by, TTL_S[_period_of(key)]]
                await self._apply(keys=[self._applied(record.record_id)], args=args, client=pipe)
            return [bool(n) for n in await pipe.execute()]

    async def apply_once(self, marker: str, triples: list[tuple[str, str, int]]) -> bool:
        """Increments not tied to a CostRecord (a scale decision), applied once per `marker`."""
        args: list[str | int] = [self.ttl_s]
        for key, field, by in triples:
            args += [key, field, by, TTL_S[_period_of(key)]]
        return bool(await self._apply(keys=[self._applied(marker)], args=args))

    async def totals(self, key: str) -> dict[str, int]:
        return {text_of(k): int(v) for k, v in (await self.client.hgetall(key)).items()}

    async def tenant_spent(self, pairs: list[tuple[str, str]]) -> list[int]:
        """[(aggregate key, tenant)] -> µUSD spent."""
        async with self.client.pipeline(transaction=False) as pipe:
            for key, tenant in pairs:
                pipe.hget(key, f"{tenant}|cost")
            return [int(v or 0) for v in await pipe.execute()]

    async def first_alert(self, tenant: str, period_key: str, threshold: int) -> bool:
        key = f"{self.ns}cost:alert:{tenant}:{period_key}:{threshold}"
        return bool(await self.client.set(key, "1", nx=True, ex=400 * 86400))


def _period_of(key: str) -> str:
    tag = key.split("cost:agg:", 1)[1][0]
    return {"h": "hour", "d": "day", "m": "month"}[tag]
