"""Exact response cache in Redis.

Filling: the router does not see the answer when it routes, so for each cacheable
request it remembers request id → cache key ("pending", short TTL); when the final
InferenceResult for that id arrives on llm.results, `complete` moves the answer under
the key (final text + usage + model). Only successful, non-shadow, non-cached results
are stored, and only under a key of the result's own tenant.
"""

from __future__ import annotations

import json
import logging

import redis.asyncio as redis
from prometheus_client import Counter

from llmbus.contract.messages import FinishReason, InferenceResult, ResultStatus, Usage
from llmbus.observability.metric_children import children_of
from llmbus.state.redis_batch import RedisBatcher
from llmbus.state.text import text_of
from llmbus_services.router.core.ports import CachedAnswer

log = logging.getLogger(__name__)
CACHE_ERRORS = Counter("llmbus_router_cache_errors_total", "Cache calls that failed (Redis error); treated as misses")
CACHE_LOOKUPS = Counter("llmbus_router_cache_lookups_total", "Exact cache lookups", ["outcome"])
_lookups = children_of(CACHE_LOOKUPS)  # per request: children looked up once


class RedisResponseCache:
    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        ttl_s: int = 3600,
        pending_ttl_s: int = 900,
        max_text_bytes: int = 256_000,
    ) -> None:
        self._client = client
        self._batch = RedisBatcher(client)  # lookups and fills of concurrent requests share round trips
        self._namespace = namespace
        self._ttl_s = ttl_s
        self._pending_ttl_s = pending_ttl_s
        self._max_text_bytes = max_text_bytes

    async def close(self) -> None:
        await self._client.aclose()

    def _entry_key(self, key: str) -> str:
        return f"llmbus:{self._namespace}:cache:{key}"

    def _pending_key(self, request: str) -> str:
        """The pending mark of a request, by its request key (tenant and request id)."""
        return f"llmbus:{self._namespace}:cache-pending:{request}"

    async def lookup(self, key: str, pending_id: str | None = None) -> CachedAnswer | None:
        """The answer cached under `key`; on a miss, `pending_id` (if given) is remembered as pending
        for `key`, so its result fills the entry.

        Two commands, not one script: the entry (by cache key) and the mark (by request id) live in
        different Redis Cluster slots. The miss's second round trip precedes a whole inference; an entry
        filled between the two is only filled once more, by this request's own answer."""
        try:
            entry = self._entry_key(key)
            raw = await self._batch.call(lambda pipe: pipe.get(entry))
            if raw is None and pending_id is not None:
                mark = self._pending_key(pending_id)
                await self._batch.call(lambda pipe: pipe.set(mark, key, ex=self._pending_ttl_s))
        except (redis.RedisError, OSError):
            CACHE_ERRORS.inc()  # a cache outage is a miss (and costs only a future hit), never a failed request
            log.warning("cache lookup failed", exc_info=True)
            return None
        _lookups("hit" if raw is not None else "miss").inc()
        if raw is None:
            return None
        data = json.loads(raw)
        return CachedAnswer(
            text=data["text"],
            usage=Usage.model_validate(data["usage"]),
            model=data["model"],
            finish_reason=FinishReason(data["finish_reason"]) if data.get("finish_reason") else None,
        )

    async def complete(self, result: InferenceResult) -> bool:
        """Store a finished answer if its request was cacheable; True when stored."""
        if result.status != ResultStatus.OK or result.cached or result.shadow:
            return False
        pending = self._pending_key(result.request_key)
        key_raw = await self._batch.call(lambda pipe: pipe.getdel(pending))
        if key_raw is None or result.tool_calls:
            return False  # (tool calls: a cached answer replays text only, so they are not kept)
        key = text_of(key_raw)
        if not key.startswith(f"{result.tenant}:"):
            return False  # a result whose tenant differs from the request's never fills that tenant's cache
        if len(result.text.encode()) > self._max_text_bytes:
            return False
        entry = {
            "text": result.text,
            "usage": result.usage.model_dump(),
            "model": result.model or "",
            "finish_reason": result.finish_reason.value if result.finish_reason else None,
        }
        target, value = self._entry_key(key), json.dumps(entry)
        await self._batch.call(lambda pipe: pipe.set(target, value, ex=self._ttl_s))
        return True
