"""Semantic cache in Redis: per tenant and model, prompt embeddings pointing at exact-cache answers.

Filling follows the exact cache: at routing, a cacheable miss leaves a pending mark (its exact key,
its index and its embedding); when its OK result arrives on llm.results, the embedding joins the
index of the request's own tenant and model, under the exact key whose answer `RedisResponseCache`
has just stored. A lookup embeds the prompt, reads that one index and takes the nearest entry at
or above the threshold (core/semantic.py); an entry whose answer expired is dropped. The index
is bounded (`max_entries`, oldest out) because a lookup reads all of it.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import redis.asyncio as redis
from prometheus_client import Counter

from llmbus.contract.messages import InferenceRequest, InferenceResult, ResultStatus
from llmbus.state.text import text_of
from llmbus_services.router.adapters.cache import RedisResponseCache
from llmbus_services.router.core.config import SemanticCachePolicy
from llmbus_services.router.core.ports import SemanticProbe
from llmbus_services.router.core.semantic import Embedder, Vector, nearest, semantic_text

log = logging.getLogger(__name__)
SEMANTIC_LOOKUPS = Counter("llmbus_router_semantic_cache_lookups_total", "Semantic cache lookups", ["outcome"])


class RedisSemanticCache:
    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        embedder: Embedder,
        policy: SemanticCachePolicy,
        answers: RedisResponseCache,
        pending_ttl_s: int = 900,
    ) -> None:
        self._client = client
        self._prefix = f"llmbus:{namespace}:semcache"
        self._embedder = embedder
        self._policy = policy
        self._answers = answers
        self._pending_ttl_s = pending_ttl_s

    def _index(self, tenant: str, model: str) -> str:
        return f"{self._prefix}:index:{tenant}:{model}"

    def _order(self, tenant: str, model: str) -> str:
        return f"{self._prefix}:order:{tenant}:{model}"

    def _pending(self, request_id: str) -> str:
        return f"{self._prefix}:pending:{request_id}"

    async def lookup(self, request: InferenceRequest, model: str) -> SemanticProbe:
        vector = self._embedder.embed([semantic_text(request)])[0]
        try:
            entries = await self._client.hgetall(self._index(request.tenant, model))  # type: ignore[misc]
        except (redis.RedisError, OSError):
            log.warning("semantic cache lookup failed; a miss", exc_info=True)
            SEMANTIC_LOOKUPS.labels("error").inc()
            return SemanticProbe(None, 0.0, vector)
        keys = [text_of(k) for k in entries]
        found = None
        if keys:
            rows = [v if isinstance(v, bytes) else v.encode() for v in entries.values()]
            matrix = np.frombuffer(b"".join(rows), dtype=np.float32).reshape(len(keys), -1)
            found = nearest(vector, matrix, self._policy.threshold)
        if found is None:
            SEMANTIC_LOOKUPS.labels("miss").inc()
            return SemanticProbe(None, 0.0, vector)
        key = keys[found[0]]
        answer = await self._answers.lookup(key)
        if answer is None:  # the answer expired before its embedding: drop the embedding too
            await self._client.hdel(self._index(request.tenant, model), key)  # type: ignore[misc]
            SEMANTIC_LOOKUPS.labels("expired").inc()
            return SemanticProbe(None, 0.0, vector)
        SEMANTIC_LOOKUPS.labels("hit").inc()
        return SemanticProbe(answer, found[1], vector)

    async def remember_pending(self, request_id: str, key: str, tenant: str, model: str, vector: Vector) -> None:
        try:
            await self._client.hset(  # type: ignore[misc]
                self._pending(request_id),
                mapping={"key": key, "tenant": tenant, "model": model, "vector": vector.astype(np.float32).tobytes()},
            )
            await self._client.expire(self._pending(request_id), self._pending_ttl_s)
        except (redis.RedisError, OSError):
            log.warning("semantic pending mark failed", exc_info=True)  # only costs a future hit

    async def complete(self, result: InferenceResult) -> bool:
        """Index a finished answer's prompt embedding if its request was a semantic-cache miss."""
        if result.status != ResultStatus.OK or result.cached or result.shadow:
            return False
        pipe = self._client.pipeline(transaction=True)
        pipe.hgetall(self._pending(result.request_key))
        pipe.delete(self._pending(result.request_key))
        pending, _ = await pipe.execute()
        if not pending:
            return False
        fields = {text_of(k): v for k, v in pending.items()}
        tenant, model, key = text_of(fields["tenant"]), text_of(fields["model"]), text_of(fields["key"])
        if tenant != result.tenant or not key.startswith(f"{tenant}:"):
            return False  # never index an answer under another tenant
        if await self._answers.lookup(key) is None:
            return False  # the exact cache did not keep it (too large, failed): nothing to point at
        pipe = self._client.pipeline(transaction=True)
        pipe.hset(self._index(tenant, model), key, fields["vector"])
        pipe.zadd(self._order(tenant, model), {key: time.time()})
        pipe.zcard(self._order(tenant, model))
        *_, size = await pipe.execute()
        if size > self._policy.max_entries:
            oldest = await self._client.zpopmin(self._order(tenant, model), size - self._policy.max_entries)
            dropped = [text_of(entry[0]) for entry in oldest if isinstance(entry, tuple | list)]
            if dropped:
                await self._client.hdel(self._index(tenant, model), *dropped)  # type: ignore[misc]
        return True
