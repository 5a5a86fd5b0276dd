"""Redis state of cost-accounting: dedupe markers, pending self-hosted results, ledger cursors,
aggregates and budget alerts. Every key carries the namespace (topic prefix) and a TTL where it can grow."""

from __future__ import annotations

import json

import redis.asyncio as redis

from llmbus.messages import CostRecord, InferenceResult
from services.cost_accounting.core.aggregates import TTL_S, increments

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


class CostStore:
    def __init__(self, client: redis.Redis, namespace: str, dedupe_ttl_s: int) -> None:
        self.client = client
        self.ns = namespace
        self.ttl_s = dedupe_ttl_s
        self._apply = client.register_script(_APPLY)

    def _seen(self, request_id: str) -> str:
        return f"{self.ns}cost:seen:{request_id}"

    def _pending(self, worker_id: str) -> str:
        return f"{self.ns}cost:pending:{worker_id}"

    # -- results: billed once -----------------------------------------------------------------
    async def seen(self, request_ids: list[str]) -> list[bool]:
        if not request_ids:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for rid in request_ids:
                pipe.exists(self._seen(rid))
            return [bool(n) for n in await pipe.execute()]

    async def mark_seen(self, request_ids: list[str]) -> None:
        if request_ids:
            async with self.client.pipeline(transaction=False) as pipe:
                for rid in request_ids:
                    pipe.set(self._seen(rid), "1", ex=self.ttl_s)
                await pipe.execute()

    async def hold(self, results: list[InferenceResult]) -> None:
        """Self-hosted results wait for their intervals: held durably and marked seen together."""
        if results:
            async with self.client.pipeline(transaction=True) as pipe:
                for r in results:
                    pipe.hset(self._pending(r.worker_id or ""), r.request_id, r.model_dump_json())
                    pipe.expire(self._pending(r.worker_id or ""), self.ttl_s)
                    pipe.set(self._seen(r.request_id), "1", ex=self.ttl_s)
                await pipe.execute()

    async def release(self, records: list[CostRecord], cursors: dict[str, dict[str, int | bool]]) -> None:
        """After the ledger's records are published: drop them from pending, save the cursors."""
        async with self.client.pipeline(transaction=True) as pipe:
            for r in records:
                if r.worker_id and r.kind == "self_hosted":
                    pipe.hdel(self._pending(r.worker_id), r.request_id)
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
        """Add each record to the aggregates once (by record id); True where it was new."""
        async with self.client.pipeline(transaction=False) as pipe:
            for record in records:
                args: list[str | int] = [self.ttl_s]
                for key, field, by in increments(record, self.ns):
                    args += [key, field, by, TTL_S[_period_of(key)]]
                await self._apply(keys=[f"{self.ns}cost:applied:{record.record_id}"], args=args, client=pipe)
            return [bool(n) for n in await pipe.execute()]

    async def apply_once(self, marker: str, triples: list[tuple[str, str, int]]) -> bool:
        """Increments not tied to a CostRecord (a scale decision), applied once per `marker`."""
        args: list[str | int] = [self.ttl_s]
        for key, field, by in triples:
            args += [key, field, by, TTL_S[_period_of(key)]]
        return bool(await self._apply(keys=[f"{self.ns}cost:applied:{marker}"], args=args))

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


def text_of(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _period_of(key: str) -> str:
    tag = key.split("cost:agg:", 1)[1][0]
    return {"h": "hour", "d": "day", "m": "month"}[tag]
