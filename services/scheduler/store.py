"""Placements in Redis: the claim that stops two instances placing an attempt twice, and what
survives a scheduler restart.

One hash per namespace, field `<request id>:<attempt>` → the placement (with its RoutedRequest,
so a dead worker's requests can still be placed again after a restart). HSETNX makes writing
the placement and claiming the attempt one atomic step: the instance that loses the race
drops its placement and publishes nothing. The field is deleted when the attempt's outcome
arrives (every instance reads every outcome, so it is deleted while any instance runs).
"""

from __future__ import annotations

import json

import redis.asyncio as redis

from llmbus.messages import RoutedRequest
from services.scheduler.policy.types import Placement, SchedRequest


def _field(request_id: str, attempt: int) -> str:
    return f"{request_id}:{attempt}"


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
    def __init__(self, client: redis.Redis, namespace: str, instance_id: str) -> None:
        self._client = client
        self._key = f"llmbus:{namespace}:placements"
        self.instance_id = instance_id

    async def claim(self, placement: Placement) -> bool:
        """Record the placement unless this attempt was already placed (by anyone); True if ours."""
        field = _field(placement.request_id, placement.attempt)
        return bool(await self._client.hsetnx(self._key, field, encode(placement, self.instance_id)))

    async def release(self, request_id: str, attempt: int) -> None:
        await self._client.hdel(self._key, _field(request_id, attempt))

    async def load(self, prefix_block_tokens: int, max_prefix_blocks: int) -> list[Placement]:
        raw = await self._client.hgetall(self._key)
        latest: dict[str, Placement] = {}
        for value in raw.values():
            placement = decode_placement(value, prefix_block_tokens, max_prefix_blocks)
            if placement is None:
                continue
            known = latest.get(placement.request_id)
            if known is None or placement.attempt > known.attempt:
                latest[placement.request_id] = placement
        return list(latest.values())
