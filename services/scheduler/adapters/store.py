"""Placements in Redis: the claim that stops two instances placing an attempt twice, and what
survives a scheduler restart.

One key per attempt, `llmbus:<namespace>:placement:<request id>:<attempt>` → the placement
(with its RoutedRequest, so a dead worker's requests can still be placed again after a
restart), written with SET NX EX: claiming the attempt and recording it is one atomic step,
and a key whose outcome never came (a lost worker and scheduler together) expires after
`ttl_s` instead of living forever. The instance that loses the race drops its placement
and publishes nothing.

Releasing: the attempt's outcome deletes its key (every instance reads every outcome, and
the attempt is over whoever placed it). Anything else — a final error, a superseded attempt —
releases only a claim this instance holds (compare-and-delete in Lua): an instance that lost
the request in a rebalance must not delete the new owner's claim.
Loading after a restart walks the keys with SCAN in bounded batches, never one huge reply.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import redis.asyncio as redis

from llmbus.contract.messages import EarlierAttempt, RoutedRequest
from llmbus.contract.request_key import RequestKey
from llmbus.state.redis_batch import RedisBatcher
from llmbus_services.scheduler.core.types import Placement, SchedRequest

# KEYS: the placement. ARGV: this instance. 1: deleted; 0: absent or another instance's.
_RELEASE_OWN = """
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local ok, data = pcall(cjson.decode, raw)
if ok and data['instance'] == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_GLOB_SPECIALS = str.maketrans({c: f"\\{c}" for c in "*?[]\\"})


def encode(placement: Placement, instance_id: str) -> str:
    request = placement.request
    return json.dumps(
        {
            "instance": instance_id,
            "request_id": placement.request_id,
            "attempt": placement.attempt,
            "worker_id": placement.worker_id,
            "model": placement.model,
            "kv_blocks": placement.kv_blocks,
            "placed_at_ms": placement.placed_at_ms,
            "uncached_tokens_est": placement.uncached_tokens_est,
            "excluded_workers": sorted(request.excluded_workers),
            "earlier": [attempt.model_dump(mode="json") for attempt in request.earlier],
            "oom_retries": request.oom_retries,
            "legs_forgiven": request.legs_forgiven,
            "kv_blocks_free_over": request.kv_blocks_free_over,
            "arrived_at_ms": request.arrived_at_ms,
            "routed": request.routed.model_dump(mode="json") if request.routed is not None else None,
        }
    )


def decode_placement(raw: bytes | str, prefix_block_tokens: int, max_prefix_blocks: int) -> Placement | None:
    data = json.loads(raw)
    if data.get("routed") is None:
        return None
    routed = RoutedRequest.model_validate(data["routed"])
    request = SchedRequest.from_routed(routed, data["arrived_at_ms"], prefix_block_tokens, max_prefix_blocks)
    request.attempt = data["attempt"]
    request.excluded_workers = set(data["excluded_workers"])
    request.earlier = [EarlierAttempt.model_validate(attempt) for attempt in data.get("earlier", [])]
    request.oom_retries = data.get("oom_retries", 0)  # .get: claims written before these fields existed
    request.kv_blocks_free_over = data.get("kv_blocks_free_over")
    request.legs_forgiven = data.get("legs_forgiven", 0)
    return Placement(
        data["request_id"],
        data["attempt"],
        data["worker_id"],
        data["model"],
        data["kv_blocks"],
        data["placed_at_ms"],
        request,
        data.get("uncached_tokens_est", 0),
    )


class PlacementStore:
    def __init__(
        self, client: redis.Redis, namespace: str, instance_id: str, ttl_s: int = 24 * 3600, scan_batch: int = 500
    ) -> None:
        self._client = client
        self._prefix = f"llmbus:{namespace}:placement:"
        self.instance_id = instance_id
        self.ttl_s = ttl_s
        self.scan_batch = scan_batch
        # Claims and releases share round trips (every outcome of a fetched batch releases one).
        self._batch = RedisBatcher(client)
        self._release_own = self._batch.script(_RELEASE_OWN)

    def key(self, request: RequestKey, attempt: int) -> str:
        return f"{self._prefix}{request}:{attempt}"

    async def claim(self, placement: Placement) -> bool:
        """Record the placement unless this attempt was already placed (by anyone); True if ours."""
        key = self.key(placement.request_key, placement.attempt)
        value = encode(placement, self.instance_id)
        return bool(await self._batch.call(lambda pipe: pipe.set(key, value, nx=True, ex=self.ttl_s)))

    async def release(self, request: RequestKey, attempt: int) -> None:
        """The attempt is over (its outcome arrived): whoever placed it, the claim goes."""
        key = self.key(request, attempt)
        await self._batch.call(lambda pipe: pipe.delete(key))

    async def release_own(self, request: RequestKey, attempt: int) -> bool:
        """Delete the claim only if this instance holds it; True if it did."""
        return bool(await self._release_own([self.key(request, attempt)], [self.instance_id]))

    async def raw_values(self) -> AsyncIterator[bytes | str]:
        """Every stored placement, read in SCAN batches (bounded replies)."""
        pattern = self._prefix.translate(_GLOB_SPECIALS) + "*"
        async for keys in _batches(self._client.scan_iter(match=pattern, count=self.scan_batch), self.scan_batch):
            # GETs in a pipeline, not one MGET: on a Redis Cluster the keys are in many slots (a cluster
            # pipeline sends each node its own); read once at start, so the longer reply costs little.
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
            for value in await pipe.execute():
                if value is not None:  # expired or released between SCAN and MGET
                    yield value

    async def load(self, prefix_block_tokens: int, max_prefix_blocks: int) -> list[Placement]:
        latest: dict[RequestKey, Placement] = {}
        async for value in self.raw_values():
            placement = decode_placement(value, prefix_block_tokens, max_prefix_blocks)
            if placement is None:
                continue
            known = latest.get(placement.request_key)
            if known is None or placement.attempt > known.attempt:
                latest[placement.request_key] = placement
        return list(latest.values())


async def _batches(keys: AsyncIterator[bytes], size: int) -> AsyncIterator[list[bytes]]:
    batch: list[bytes] = []
    async for key in keys:
        batch.append(key)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
