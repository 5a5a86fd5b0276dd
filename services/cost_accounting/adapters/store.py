"""Redis state of cost-accounting: dedupe markers, pending self-hosted results, ledger cursors,
aggregates and budget alerts. Every key carries the namespace (topic prefix) and a TTL where it can grow.

Every key is `{<prefix>cost}:<kind>:…` (llmbus.state.keys.cost_key_root): one hash tag, so on a Redis
Cluster they all live in one slot, and every script is given every key it touches (KEYS; none is built
inside a script), so each runs on one node. Keys written before the tag (`<prefix>cost:…`) are moved
to their tagged names once, at start (`adopt_untagged_keys`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import redis.asyncio as redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError
from redis.typing import EncodableT, FieldT

from llmbus.contract.messages import CostRecord, InferenceResult, now_ms
from llmbus.contract.request_key import request_key
from llmbus.state.keys import cost_key_root, glob_literal, legacy_cost_key_root
from llmbus.state.text import text_of
from llmbus_services.cost_accounting.core.aggregates import TTL_S, batch_increments, increments
from llmbus_services.cost_accounting.core.costing import ServedRequest
from llmbus_services.cost_accounting.core.gpu_ledger import Cursor

log = logging.getLogger(__name__)

# A cost record is applied once: its marker and its increments in one atomic step.
# KEYS: the marker, then one hash per increment. ARGV: marker TTL, then (field, increment, TTL) per hash.
_APPLY = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) == false then return 0 end
for i = 2, #KEYS do
  local at = 2 + 3 * (i - 2)
  redis.call('HINCRBY', KEYS[i], ARGV[at], ARGV[at + 1])
  if redis.call('TTL', KEYS[i]) < 0 then redis.call('EXPIRE', KEYS[i], ARGV[at + 2]) end
end
return 1
"""

# A batch of billed records in one atomic step: every record's marker, the seen markers of the
# results they price, the batch's summed increments, and the records out of the outbox -- or
# nothing, if any marker is already there (someone applied one of them: the caller falls back to
# _BILL_ONE record by record).
# KEYS: the outbox, n applied markers, m seen markers, then the aggregate hashes.
# ARGV: marker TTL, n, m, the n record ids (the outbox's fields), then per aggregate hash: its TTL,
# its number of fields k, then k (field, increment) pairs.
_BILL = """
local ttl, n, m = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 2, 1 + n do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 0 end
end
for i = 2, 1 + n + m do redis.call('SET', KEYS[i], '1', 'EX', ttl) end
for i = 4, 3 + n, 1000 do redis.call('HDEL', KEYS[1], unpack(ARGV, i, math.min(i + 999, 3 + n))) end
local at = 4 + n
for h = 2 + n + m, #KEYS do
  local key_ttl, k = ARGV[at], tonumber(ARGV[at + 1])
  at = at + 2
  for j = 0, k - 1 do redis.call('HINCRBY', KEYS[h], ARGV[at + 2*j], ARGV[at + 2*j + 1]) end
  at = at + 2 * k
  if redis.call('TTL', KEYS[h]) < 0 then redis.call('EXPIRE', KEYS[h], key_ttl) end
end
return 1
"""

# One billed record, always correct: out of the outbox, its result marked seen, and -- unless its
# marker is there -- its marker and increments. KEYS: the marker, the outbox, s seen markers (0 or 1),
# then one hash per increment. ARGV: TTL, outbox field, s, then (field, increment, TTL) per hash.
_BILL_ONE = """
local s = tonumber(ARGV[3])
redis.call('HDEL', KEYS[2], ARGV[2])
for i = 3, 2 + s do redis.call('SET', KEYS[i], '1', 'EX', ARGV[1]) end
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) == false then return 0 end
for i = 3 + s, #KEYS do
  local at = 4 + 3 * (i - 3 - s)
  redis.call('HINCRBY', KEYS[i], ARGV[at], ARGV[at + 1])
  if redis.call('TTL', KEYS[i]) < 0 then redis.call('EXPIRE', KEYS[i], ARGV[at + 2]) end
end
return 1
"""

# Which of a batch's markers exist: their positions (1-based), usually none, rather than a reply
# per key (parsing thousands of nils cost more than the lookups). KEYS: the markers.
_PRESENT = """
local out = {}
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then out[#out + 1] = i end
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
# bytes or nothing. KEYS: the outbox, then each record's applied marker. ARGV: (record id, bytes) pairs.
_STAGE = """
local out = {}
for i = 2, #KEYS do
  local at = 2 * (i - 1) - 1
  if redis.call('EXISTS', KEYS[i]) == 1 then out[#out + 1] = 0
  elseif redis.call('HSETNX', KEYS[1], ARGV[at], ARGV[at + 1]) == 1 then out[#out + 1] = 1
  else out[#out + 1] = redis.call('HGET', KEYS[1], ARGV[at]) end
end
return out
"""

# Records per billing script. A script runs alone on the Redis server: measured here, one of 2000
# records took ~17 ms and one of 500 ~8 ms (most of it the batch's few thousand increments, whatever
# its size), so smaller chunks would cost Redis more in total. This bounds what a large close of the
# ledger (thousands of records at once) makes others wait.
BILL_CHUNK_RECORDS = 2000


class CostStore:
    def __init__(self, client: redis.Redis, namespace: str, dedupe_ttl_s: int) -> None:
        self.client = client
        self.ns = namespace  # the topic prefix
        self.root = cost_key_root(namespace)  # every key: `{<prefix>cost}:<kind>:…`
        self.ttl_s = dedupe_ttl_s
        self.started_at_ms = now_ms()  # results completed before it may carry a marker of the older scheme
        self._apply = client.register_script(_APPLY)
        self._bill = client.register_script(_BILL)
        self._bill_one = client.register_script(_BILL_ONE)
        self._present = client.register_script(_PRESENT)
        self._lease = client.register_script(_LEASE)
        self._stage = client.register_script(_STAGE)

    def _seen(self, key: str) -> str:
        """A result's dedupe marker, by its request key (tenant and request id)."""
        return f"{self.root}seen:{key}"

    def _pending(self, worker_id: str) -> str:
        return f"{self.root}pending:{worker_id}"

    # -- keys from before the hash tag --------------------------------------------------------
    async def adopt_untagged_keys(self, wait_s: float = 600.0) -> int:
        """Keys written before the hash tag (`<prefix>cost:…`) moved to their tagged names, once, by one
        replica (the others wait for it), before anything is billed: markers, outbox, held results,
        cursors and totals go on as they were. How many keys this replica moved.

        Not on a Redis Cluster: cost-accounting's scripts could not run there before the tag."""
        if isinstance(self.client, redis.RedisCluster):
            return 0
        legacy = legacy_cost_key_root(self.ns)
        legacy_state = f"{legacy}state"  # moved last: while it is there, the move is not done
        if not await self.client.exists(legacy_state):
            return 0
        if not await self.client.set(f"{self.root}adopting", "1", nx=True, ex=int(wait_s)):
            deadline = time.monotonic() + wait_s
            while await self.client.exists(legacy_state) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            return 0
        moved = 0
        try:
            names: list[str] = []
            async for key in self.client.scan_iter(match=f"{glob_literal(legacy)}*", count=1000):
                if (name := text_of(key)) != legacy_state:
                    names.append(name)
                if len(names) >= 1000:
                    moved += await self._move(names, legacy)
                    names = []
            moved += await self._move([*names, legacy_state], legacy)
        finally:
            await self.client.delete(f"{self.root}adopting")
        log.info("cost-accounting: %d keys moved from %s* to %s*", moved, legacy, self.root)
        return moved

    async def _move(self, names: list[str], legacy: str) -> int:
        async with self.client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.renamenx(name, self.root + name.removeprefix(legacy))
            replies = await pipe.execute(raise_on_error=False)
        if kept := [name for name, reply in zip(names, replies, strict=True) if reply is not True and reply != 1]:
            log.warning(
                "cost-accounting: %d keys kept under their old names (the new name exists): %s", len(kept), kept[:5]
            )
        return len(names) - len(kept)

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
        flags = await self._with_marker([self._seen(k) for k in [*keys, *(results[i].request_id for i in legacy)]])
        for n, i in enumerate(legacy):
            flags[i] = flags[i] or flags[len(keys) + n]
        return flags[: len(keys)]

    async def _with_marker(self, markers: list[str]) -> list[bool]:
        flags = [False] * len(markers)
        if markers:
            for position in await self._present(keys=markers):
                flags[int(position) - 1] = True
        return flags

    async def hold(self, served: list[tuple[ServedRequest, bytes]]) -> None:
        """Self-hosted results (with their bytes as read) wait for their intervals: each part the GPU ledger
        prices (the result, or a leg of it) held durably under its worker and record id, and the result
        marked seen, together (MULTI)."""
        await self.hold_raw([(s.worker_id, s.key, s.result.request_key, payload) for s, payload in served])

    async def hold_raw(self, held: list[tuple[str, str, str, bytes]]) -> None:
        """(worker id, record id, request key, result bytes) held and marked seen, as `hold`."""
        if not held:
            return
        by_worker: dict[str, dict[FieldT, EncodableT]] = {}
        for worker_id, key, _, payload in held:
            by_worker.setdefault(self._pending(worker_id), {})[key] = payload
        seen = sorted({self._seen(request) for _, _, request, _ in held})
        async with self.client.pipeline(transaction=True) as pipe:
            for pending, results in by_worker.items():
                pipe.hset(pending, mapping=results)
                pipe.expire(pending, self.ttl_s)
            for seen_key in seen:  # plain commands in the MULTI: a cluster's transaction loads no script
                pipe.set(seen_key, "1", ex=self.ttl_s)
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
        return await self._with_marker([self._applied(record_id) for record_id in record_ids])

    # -- Redis data loss: a marker of the state, and the once-only markers rebuilt from llm.costs -----
    @property
    def _state(self) -> str:
        return f"{self.root}state"

    async def state_id(self) -> str | None:
        """The id of the state this Redis holds (set once by the first replica); None: never set, or lost."""
        return text_of(raw) if (raw := await self.client.get(self._state)) is not None else None

    async def mark_state(self, floor_ms: int | None = None) -> tuple[str, bool]:
        """This state's id, and whether this call set it: a new one if none is there (the first replica
        after a loss, or of all, sets it). `floor_ms`: a loss found by the caller, kept in the id where
        every replica that starts on this state reads it (`loss_floor_ms`)."""
        state = uuid.uuid4().hex if floor_ms is None else f"{uuid.uuid4().hex}@{floor_ms}"
        won = bool(await self.client.set(self._state, state, nx=True))
        return (text_of(raw) if (raw := await self.client.get(self._state)) is not None else state), won

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
                done.setdefault(self._pending(r.worker_id), []).append(
                    r.record_id or request_key(r.tenant, r.request_id)
                )
        async with self.client.pipeline(transaction=True) as pipe:
            for key, request_keys in done.items():  # one HDEL per worker, not one per record
                pipe.hdel(key, *request_keys)
            for worker_id, cursor in cursors.items():
                pipe.hset(self._cursors, worker_id, json.dumps(cursor))
            await pipe.execute()

    # -- GPU ledger ownership: one replica per worker ------------------------------------------
    async def lease(self, worker_ids: list[str], replica_id: str, lease_ms: int) -> set[str]:
        """The workers whose GPU time this replica prices now (leases renewed, free ones taken)."""
        if not worker_ids:
            return set()
        replies = await self._run_scripts(
            [(self._lease, [f"{self.root}owner:{w}"], [replica_id, lease_ms]) for w in worker_ids]
        )
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
        raw = await self.client.hget(self._cursors, worker_id)
        return json.loads(raw) if raw is not None else None

    async def load_held(self) -> tuple[list[InferenceResult], dict[str, Cursor]]:
        held: list[InferenceResult] = []
        async for key in self.client.scan_iter(match=f"{glob_literal(self.root)}pending:*", count=500):
            for raw in (await self.client.hgetall(key)).values():
                held.append(InferenceResult.model_validate_json(raw))
        cursors = {text_of(k): json.loads(v) for k, v in (await self.client.hgetall(self._cursors)).items()}
        return held, cursors

    # -- billing: outbox, then llm.costs, then aggregates -------------------------------------------
    @property
    def _outbox(self) -> str:
        return f"{self.root}outbox"

    @property
    def _cursors(self) -> str:
        return f"{self.root}cursor"

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
        keys = [self._outbox, *(self._applied(record_id) for record_id in first)]
        args: list[str | bytes] = []
        for record_id, (_, payload) in first.items():
            args += [record_id, payload]
        out: list[tuple[CostRecord, bytes]] = []
        for (record, payload), reply in zip(first.values(), await self._stage(keys=keys, args=args), strict=True):
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
        replies = await self._run_scripts(
            [(self._bill, *self._bill_args([records[i] for i in chunk])) for chunk in chunks]
        )
        new: set[int] = set()
        for chunk, applied in zip(chunks, replies, strict=True):
            if applied:
                new.update(chunk)
            else:
                flags = await self.bill_one_by_one([records[i] for i in chunk])
                new.update(i for i, flag in zip(chunk, flags, strict=True) if flag)
        return [i in new for i in range(len(records))]

    def _bill_args(self, unique: list[CostRecord]) -> tuple[list[str], list[str | int]]:
        """_BILL's keys and arguments for these records (one copy of each record id)."""
        seen = [self._seen(request_key(r.tenant, r.request_id)) for r in unique if r.prices_a_result]
        keys = [self._outbox, *(self._applied(r.record_id) for r in unique), *seen]
        args: list[str | int] = [self.ttl_s, len(unique), len(seen), *(r.record_id for r in unique)]
        for key, fields in batch_increments(unique, self.ns).items():
            keys.append(key)
            args += [TTL_S[_period_of(key)], len(fields)]
            for field, by in fields.items():
                args += [field, by]
        return keys, args

    def _applied(self, record_id: str) -> str:
        return f"{self.root}applied:{record_id}"

    async def bill_one_by_one(self, records: list[CostRecord]) -> list[bool]:
        """Each record with its own marker and increments in one script: the slow, always-correct path."""
        calls: list[tuple[AsyncScript, list[str], list[str | int]]] = []
        for record in records:
            seen = self._seen_marker_of(record)
            keys = [self._applied(record.record_id), self._outbox, *seen]
            args: list[str | int] = [self.ttl_s, record.record_id, len(seen)]
            for key, field, by in increments(record, self.ns):
                keys.append(key)
                args += [field, by, TTL_S[_period_of(key)]]
            calls.append((self._bill_one, keys, args))
        return [bool(n) for n in await self._run_scripts(calls)]

    async def _run_scripts(self, calls: Sequence[tuple[AsyncScript, Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Scripts in one pipeline (not a transaction), each reply in order. A script a node does not know
        (restarted, flushed; a cluster pipeline loads none itself) is loaded there and only the calls
        refused for it go again: they never ran."""
        replies = await self._pipeline_of(calls)
        refused = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if refused:
            for script in {id(calls[i][0]): calls[i][0] for i in refused}.values():
                await self.client.script_load(script.script)
            for i, reply in zip(refused, await self._pipeline_of([calls[i] for i in refused]), strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    async def _pipeline_of(self, calls: Sequence[tuple[AsyncScript, Sequence[str], Sequence[Any]]]) -> list[Any]:
        async with self.client.pipeline(transaction=False) as pipe:
            for script, keys, args in calls:
                # execute_command: a cluster pipeline routes EVALSHA by its keys (one slot: one node)
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            return list(await pipe.execute(raise_on_error=False))

    async def apply_once(self, marker: str, triples: list[tuple[str, str, int]]) -> bool:
        """Increments not tied to a CostRecord (a scale decision), applied once per `marker`."""
        keys = [self._applied(marker)]
        args: list[str | int] = [self.ttl_s]
        for key, field, by in triples:
            keys.append(key)
            args += [field, by, TTL_S[_period_of(key)]]
        return bool(await self._apply(keys=keys, args=args))

    async def totals(self, key: str) -> dict[str, int]:
        return {text_of(k): int(v) for k, v in (await self.client.hgetall(key)).items()}

    async def tenant_spent(self, pairs: list[tuple[str, str]]) -> list[int]:
        """[(aggregate key, tenant)] -> µUSD spent."""
        async with self.client.pipeline(transaction=False) as pipe:
            for key, tenant in pairs:
                pipe.hget(key, f"{tenant}|cost")
            return [int(v or 0) for v in await pipe.execute()]

    # -- writes lost after Redis acknowledged them (a restart from its append-only file, a failover) -----
    async def written(self, replica_id: str) -> int | None:
        """The last tick this replica wrote that Redis still holds (None: none)."""
        raw = await self.client.get(f"{self.root}written:{replica_id}")
        return int(raw) if raw is not None else None

    async def mark_written(self, replica_id: str, tick: int) -> None:
        await self.client.set(f"{self.root}written:{replica_id}", tick, ex=self.ttl_s)

    async def first_alert(self, tenant: str, period_key: str, threshold: int) -> bool:
        key = f"{self.root}alert:{tenant}:{period_key}:{threshold}"
        return bool(await self.client.set(key, "1", nx=True, ex=400 * 86400))


def loss_floor_ms(state: str) -> int | None:
    """Where lives without a cursor start on a state set after a data loss (None: no loss before it)."""
    _, at, floor = state.partition("@")
    return int(floor) if at else None


def _period_of(key: str) -> str:
    tag = key.split(":agg:", 1)[1][0]
    return {"h": "hour", "d": "day", "m": "month"}[tag]
