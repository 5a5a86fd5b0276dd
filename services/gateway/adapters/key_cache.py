"""API keys remembered for a few seconds: a client's requests do not each cost a Redis round trip.

A key found in Redis is kept by the SHA-256 of its secret (never the secret) for `ttl_s`, then looked
up again. So a revoked key stops working on this gateway instance at most `ttl_s` after the revocation
(`LLMBUS_GATEWAY_API_KEY_CACHE_S`, docs/security.md); 0 looks every key up on every request. A key that
is not found is never remembered: a key created a moment ago works at once, and a stream of made-up
keys costs Redis what it did before, never this process's memory. At most `max_keys` are kept (the
oldest entry goes first).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from llmbus.security.apikeys import ApiKey, ApiKeyStore, key_hash


class CachedKeys:
    def __init__(
        self,
        store: ApiKeyStore,
        ttl_s: float,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._clock = clock
        self._found: dict[str, tuple[float, ApiKey]] = {}  # sha256 of the secret → (kept until, key)

    async def lookup(self, secret: str) -> ApiKey | None:
        digest = key_hash(secret)
        now = self._clock()
        kept = self._found.get(digest)
        if kept is not None and now < kept[0]:
            return kept[1]
        key = await self.store.lookup_hash(digest)
        if key is None or self.ttl_s <= 0:
            self._found.pop(digest, None)
            return key
        self._found.pop(digest, None)  # re-inserted last: the oldest entries are the first in the dict
        if len(self._found) >= self.max_keys:
            del self._found[next(iter(self._found))]
        self._found[digest] = (now + self.ttl_s, key)
        return key
