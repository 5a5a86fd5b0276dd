"""Redis state of cost-accounting: dedupe markers, pending self-hosted results, ledger cursors,
aggregates and budget alerts. Every key carries the namespace (topic prefix) and a TTL where it can grow."""

from __future__ import annotations

import json
import uuid

import redis.asyncio as redis
from redis.typing import EncodableT, FieldT

from llmbus.contract.messages import CostRecord, InferenceResult, now_ms
from llmbus.contract.request_key import request_key
from llmbus.state.text import text_of
from llmbus_services.cost_accounting.core.aggregates import TTL_S, batch_increments, increments
from llmbus_services.cost_accounting.core.gpu_ledger import Cursor

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

# A batch of billed records in one atomic step: every record's marker, the seen markers of the
# results they price, the batch's summed increments, and the records out of the outbox -- or
# nothing, if any marker is already there (someone applied one of them: the caller falls back to
# _BILL_ONE record by record). Keys are built here from the ids (half the arguments to send).
# ARGV: marker TTL, namespace, n record ids, m request ids to mark seen, the n record ids, the m
# request ids, then per hash key: key, TTL, number of fields, then field, increment pairs.
_BILL = """
local ttl, ns, n, m = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local applied, seen, outbox = ns .. 'cost:applied:', ns .. 'cost:seen:', ns .. 'cost:outbox'
for i = 5, 4 + n do
  if redis.call('EXISTS', applied .. ARGV[i]) == 1 then return 0 end
end
for i = 5, 4 + n do redis.call('SET', applied .. ARGV[i], '1', 'EX', ttl) end
for i = 5 + n, 4 + n + m do redis.call('SET', seen .. ARGV[i], '1', 'EX', ttl) end
for i = 5, 4 + n, 1000 do redis.call('HDEL', outbox, unpack(ARGV, i, math.min(i + 999, 4 + n))) end
local at = 5 + n + m
while at <= #ARGV do
  local key, key_ttl, k = ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2])
  at = at + 3
  for j = 0, k - 1 do redis.call('HINCRBY', key, ARGV[at + 2*j], ARGV[at + 2*j + 1]) end
  at = at + 2 * k
  if redis.call('TTL', key) < 0 then redis.call('EXPIRE', key, key_ttl) end
end
return 1
"""

# One billed record, always correct: out of the outbox, its result marked seen, and -- unless its
# marker is there -- its marker and increments. KEYS: the marker, then the seen marker (if any).
# ARGV: TTL, outbox key, outbox field, then (key, field, increment, TTL) quadruples.
_BILL_ONE = """
redis.call('HDEL', ARGV[2], ARGV[3])
for i = 2, #KEYS do redis.call('SET', KEYS[i], '1', 'EX', ARGV[1]) end
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) == false then return 0 end
for i = 4, #ARGV, 4 do
  redis.call('HINCRBY', ARGV[i], ARGV[i + 1], ARGV[i + 2])
  if redis.call('TTL', ARGV[i]) < 0 then redis.call('EXPIRE', ARGV[i], ARGV[i + 3]) end
end
return 1
"""

# Which of a batch's ids have a marker: their positions (1-based), usually none, rather than a reply
# per id (parsing thousands of nils cost more than the lookups). ARGV: the markers' prefix, the ids.
_PRESENT = """
local out = {}
for i = 2, #ARGV do
  if redis.call('EXISTS', ARGV[1] .. ARGV[i]) == 1 then out[#out + 1] = i - 1 end
end
return out
"""

# One replica prices a worker's GPU time: it holds the worker's lease (renewed each tick) or takes a
# free one. KEYS[1]: the lease. ARGV: this replica's id, the lease's life in ms. 1: this replica owns it.
_LEASE = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# Records into the outbox, each id once: a record already applied is skipped (0), one staged before
# keeps its bytes (returned: they are the record), else these bytes are staged (1). So two bills of
# one record id (a restart closing an interval again, two owners for a moment) publish the same
# bytes or nothing. ARGV: the applied markers' prefix, the outbox, then (record id, bytes) pairs.
_STAGE = """
local out = {}
for i = 3, #ARGV, 2 do
  if redis.call('EXISTS', ARGV[1] .. ARGV[i]) == 1 then out[#out + 1] = 0
  elseif redis.call('HSETNX', ARGV[2], ARGV[i], ARGV[i + 1]) == 1 then out[#out + 1] = 1
  else out[#out + 1] = redis.call('HGET', ARGV[2], ARGV[i]) end
end
return out
"""

# Results' dedupe markers, all of a batch in one command (SET has no multi-key form with a TTL).
_MARK = """
for i = 1, #KEYS do redis.call('SET', KEYS[i], '1', 'EX', ARGV[1]) end
return #KEYS
"""


# Records per billing script. A script runs alone on the Redis server: measured here, one of 2000
# records took ~17 ms and one of 500 ~8 ms (most of it the batch's few thousand increments, whatever
# its size), so smaller chunks would cost Redis more in total. This bounds what a large close of the
# ledger (thousands of records at once) makes others wait.
BILL_CHUNK_RECORDS = 2000


class CostStore:
    def __init__(self, client: redis.Redis, namespace: str, dedupe_ttl_s: int) -> None:
        self.client = client
        self.ns = namespace
        self.ttl_s = dedupe_ttl_s
        self.started_at_ms = now_ms()  # results completed before it may carry a marker of the older scheme
        self._apply = client.register_script(_APPLY)
        self._bill = client.register_script(_BILL)
        self._bill_one = client.register_script(_BILL_ONE)
        self._mark = client.register_script(_MARK)
        self._present = client.register_script(_PRESENT)
        self._lease = client.register_script(_LEASE)
        self._stage = client.register_script(_STAGE)

    def _seen(self, key: str) -> str:
        """A result's dedupe marker, by its request key (tenant and request id)."""
        return f"{self.ns}cost:seen:{key}"

    def _pending(self, worker_id: str) -> str:
        return f"{self.ns}cost:pending:{worker_id}"

    # -- results: billed once -----------------------------------------------------------------
    async def seen(self, results: list[InferenceResult]) -> list[bool]:
        """Which results of the batch were taken already (one script for the batch).

        A result completed before this replica started is also looked up under the marker it had
        before request keys carried the tenant (`cost:seen:<request id>`): what an older version
        billed just before an upgrade is not billed again. Markers are only written under the
        request key, so the older ones are read only until they expire (the dedupe TTL) and only
        for results from before the upgrade."""
        keys = [r.request_key for r in results]
        legacy = [i for i, r in enumerate(results) if r.completed_at_ms < self.started_at_ms]
        flags = await self._with_marker(self._seen(""), [*keys, *(results[i].request_id for i in legacy)])
        for n, i in enumerate(legacy):
            flags[i] = flags[i] or flags[len(keys) + n]
        return flags[: len(keys)]

    async def _with_marker(self, prefix: str, ids: list[str]) -> list[bool]:
        flags = [False] * len(ids)
        if ids:
            for position in await self._present(args=[prefix, *ids]):
                flags[int(position) - 1] = True
        return flags

    async def hold(self, results: list[tuple[InferenceResult, bytes]]) -> None:
        """Self-hosted results (with their bytes as read) wait for their intervals: held durably and
        marked seen together (MULTI)."""
        await self.hold_raw([(r.worker_id or "", r.request_key, payload) for r, payload in results])

    async def hold_raw(self, held: list[tuple[str, str, bytes]]) -> None:
        """(worker id, request key, result bytes) held and marked seen, as `hold`."""
        if not held:
            return
        by_worker: dict[str, dict[FieldT, EncodableT]] = {}
        for worker_id, key, payload in held:
            by_worker.setdefault(self._pending(worker_id), {})[key] = payload
        async with self.client.pipeline(transaction=True) as pipe:
            for pending, results in by_worker.items():
                pipe.hset(pending, mapping=results)
                pipe.expire(pending, self.ttl_s)
            await self._mark(keys=[self._seen(key) for _, key, _ in held], args=[self.ttl_s], client=pipe)
            await pipe.execute()

    async def still_held(self, held: list[tuple[str, str]]) -> list[bool]:
        """Which (worker id, request key) are in their worker's held results (not released, not lost)."""
        if not held:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for worker_id, key in held:
                pipe.hexists(self._pending(worker_id), key)
            return [bool(n) for n in await pipe.execute()]

    async def applied(self, record_ids: list[str]) -> list[bool]:
        """Which record ids are billed (their once-only marker is there)."""
        return await self._with_marker(self._applied(""), record_ids)

    # -- Redis data loss: a marker of the state, and the once-only markers rebuilt from llm.costs -----
    @property
    def _state(self) -> str:
        return f"{self.ns}cost:state"

    async def state_id(self) -> str | None:
        """The id of the state this Redis holds (set once by the first replica); None: never set, or lost."""
        return text_of(raw) if (raw := await self.client.get(self._state)) is not None else None

    async def mark_state(self) -> str:
        """This state's id: a new one if none is there (the first replica after a loss sets it)."""
        state = uuid.uuid4().hex
        await self.client.set(self._state, state, nx=True)
        return text_of(raw) if (raw := await self.client.get(self._state)) is not None else state

    async def restore_billed(self, records: list[CostRecord]) -> None:
        """The once-only markers of records on llm.costs, written again: each record id applied, each
        result it prices seen (a result read again after a data loss is then not billed again)."""
        for at in range(0, len(records), 1000):
            async with self.client.pipeline(transaction=False) as pipe:
                for record in records[at : at + 1000]:
                    pipe.set(self._applied(record.record_id), "1", ex=self.ttl_s)
                    for seen in self._seen_marker_of(record):
                        pipe.set(seen, "1", ex=self.ttl_s)
                await pipe.execute()

    async def release(self, records: list[CostRecord], cursors: dict[str, Cursor]) -> None:
        """After the ledger's records are published: drop them from pending, save the cursors."""
        done: dict[str, list[str]] = {}
        for r in records:
            if r.worker_id and r.kind == "self_hosted":
                done.setdefault(self._pending(r.worker_id), []).append(request_key(r.tenant, r.request_id))
        async with self.client.pipeline(transaction=True) as pipe:
            for key, request_keys in done.items():  # one HDEL per worker, not one per record
                pipe.hdel(key, *request_keys)
            for worker_id, cursor in cursors.items():
                pipe.hset(f"{self.ns}cost:cursor", worker_id, json.dumps(cursor))
            await pipe.execute()

    # -- GPU ledger ownership: one replica per worker ------------------------------------------
    async def lease(self, worker_ids: list[str], replica_id: str, lease_ms: int) -> set[str]:
        """The workers whose GPU time this replica prices now (leases renewed, free ones taken)."""
        if not worker_ids:
            return set()
        async with self.client.pipeline(transaction=False) as pipe:
            for worker_id in worker_ids:
                await self._lease(keys=[f"{self.ns}cost:owner:{worker_id}"], args=[replica_id, lease_ms], client=pipe)
            replies = await pipe.execute()
        return {w for w, owned in zip(worker_ids, replies, strict=True) if owned}

    async def held_ids(self, worker_ids: list[str]) -> dict[str, set[str]]:
        """The request keys held for each worker, whichever replica took them."""
        async with self.client.pipeline(transaction=False) as pipe:
            for worker_id in worker_ids:
                pipe.hkeys(self._pending(worker_id))
            replies = await pipe.execute()
        return {w: {text_of(k) for k in keys} for w, keys in zip(worker_ids, replies, strict=True)}

    async def held_results(self, worker_id: str, request_keys: list[str]) -> list[InferenceResult]:
        if not request_keys:
            return []
        raw = await self.client.hmget(self._pending(worker_id), request_keys)
        return [InferenceResult.model_validate_json(v) for v in raw if v is not None]

    async def cursor(self, worker_id: str) -> Cursor | None:
        raw = await self.client.hget(f"{self.ns}cost:cursor", worker_id)
        return json.loads(raw) if raw is not None else None

    async def load_held(self) -> tuple[list[InferenceResult], dict[str, Cursor]]:
        held: list[InferenceResult] = []
        async for key in self.client.scan_iter(match=f"{self.ns}cost:pending:*", count=500):
            for raw in (await self.client.hgetall(key)).values():
                held.append(InferenceResult.model_validate_json(raw))
        cursors = {text_of(k): json.loads(v) for k, v in (await self.client.hgetall(f"{self.ns}cost:cursor")).items()}
        return held, cursors

    # -- billing: outbox, then llm.costs, then aggregates -------------------------------------------
    @property
    def _outbox(self) -> str:
        return f"{self.ns}cost:outbox"

    async def stage(self, records: list[CostRecord], payloads: list[bytes]) -> list[tuple[CostRecord, bytes]]:
        """The records exactly as they will be published, kept until they are applied (the outbox).

        Returns what to publish and apply: per record id (its first copy in the batch), nothing if it
        was applied already, the bytes staged before if there are (that record, not this one), else
        these bytes."""
        first: dict[str, tuple[CostRecord, bytes]] = {}
        for record, payload in zip(records, payloads, strict=True):
            first.setdefault(record.record_id, (record, payload))
        if not first:
            return []
        args: list[str | bytes] = [self._applied(""), self._outbox]
        for record_id, (_, payload) in first.items():
            args += [record_id, payload]
        out: list[tuple[CostRecord, bytes]] = []
        for (record, payload), reply in zip(first.values(), await self._stage(args=args), strict=True):
            if isinstance(reply, bytes | str):  # staged before: the record is those bytes
                staged = reply.encode() if isinstance(reply, str) else reply
                out.append((CostRecord.model_validate_json(staged), staged))
            elif reply:
                out.append((record, payload))
        return out

    async def staged(self) -> list[bytes]:
        """What was staged and not yet applied: published or not, it has to be (again) and then applied."""
        return [v.encode() if isinstance(v, str) else v for v in (await self.client.hgetall(self._outbox)).values()]

    def _seen_marker_of(self, record: CostRecord) -> list[str]:
        """A record that prices one result also marks it seen (idle and waste records price none)."""
        return [self._seen(request_key(record.tenant, record.request_id))] if record.prices_a_result else []

    async def bill(self, records: list[CostRecord]) -> list[bool]:
        """Apply each (published) record to the aggregates once, by record id, mark the results it
        prices seen and take it out of the outbox; True where it was new.

        One round trip whatever the batch size: one script per `BILL_CHUNK_RECORDS` records sets
        their markers and adds their increments summed (a few thousand fields instead of ~150 per
        record), all or nothing; the scripts go in one pipeline. Only if a marker is already there
        (a copy applied before: a recovery, another replica) does that chunk go record by record.
        """
        if not records:
            return []
        first: dict[str, int] = {}  # record id -> index of its first copy (twice in a batch counts once)
        for i, record in enumerate(records):
            first.setdefault(record.record_id, i)
        unique = list(first.values())
        chunks = [unique[at : at + BILL_CHUNK_RECORDS] for at in range(0, len(unique), BILL_CHUNK_RECORDS)]
        async with self.client.pipeline(transaction=False) as pipe:
            for chunk in chunks:
                await self._bill(args=self._bill_args([records[i] for i in chunk]), client=pipe)
            replies = await pipe.execute()
        new: set[int] = set()
        for chunk, applied in zip(chunks, replies, strict=True):
            if applied:
                new.update(chunk)
            else:
                flags = await self.bill_one_by_one([records[i] for i in chunk])
                new.update(i for i, flag in zip(chunk, flags, strict=True) if flag)
        return [i in new for i in range(len(records))]

    def _bill_args(self, unique: list[CostRecord]) -> list[str | int]:
        seen = [request_key(r.tenant, r.request_id) for r in unique if r.prices_a_result]
        args: list[str | int] = [self.ttl_s, self.ns, len(unique), len(seen), *(r.record_id for r in unique), *seen]
        for key, fields in batch_increments(unique, self.ns).items():
            args += [key, TTL_S[_period_of(key)], len(fields)]
            for field, by in fields.items():
                args += [field, by]
        return args

    def _applied(self, record_id: str) -> str:
        return f"{self.ns}cost:applied:{record_id}"

    async def bill_one_by_one(self, records: list[CostRecord]) -> list[bool]:
        """Each record with its own marker and increments in one script: the slow, always-correct path."""
        async with self.client.pipeline(transaction=False) as pipe:
            for record in records:
                args: list[str | int] = [self.ttl_s, self._outbox, record.record_id]
                for key, field, by in increments(record, self.ns):
                    args += [key, field, by, TTL_S[_period_of(key)]]
                keys = [self._applied(record.record_id), *self._seen_marker_of(record)]
                await self._bill_one(keys=keys, args=args, client=pipe)
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
