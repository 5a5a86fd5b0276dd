"""API keys of the gateway: a key names its tenant; Redis holds only a hash of it.

A key is 256 random bits, so a plain SHA-256 is enough to make a leaked Redis useless
(no dictionary to attack; a slow password hash would only cost every request).
The secret is shown once, at creation; afterwards a key is known by its id. A key's record and the
index of key ids are two keys (two slots of a Redis Cluster): they are written one after the other in
an order that is safe to stop between, never in one transaction.
`export` and `restore` copy the stored hashes out and back (`llmbus keys export|import`): a Redis
that lost its data takes its keys back from such a file, and every client's key works again.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Annotated

import redis.asyncio as redis
from pydantic import BaseModel, Field, StringConstraints

from llmbus.contract.messages import now_ms
from llmbus.state.text import text_of

KEY_PREFIX = "sk-llmbus-"

TenantName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]


class ApiKey(BaseModel):
    """What Redis keeps about one key (never the key itself)."""

    key_id: str
    tenant: TenantName
    name: str = Field(default="", max_length=128)
    created_at_ms: int = Field(default_factory=now_ms)


class StoredKey(ApiKey):
    """A key as exported: what Redis keeps about it, with the SHA-256 of its secret (no secret)."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiKeyStore:
    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self._client = client
        self._by_hash = f"llmbus:{namespace}:apikey:"  # + sha256 of the secret -> ApiKey JSON
        self._index = f"llmbus:{namespace}:apikeys"  # hash: key id -> sha256 of the secret

    async def create(self, tenant: str, name: str = "") -> tuple[str, ApiKey]:
        """A new key for `tenant`: returns the secret (shown once) and what is stored."""
        record = ApiKey(key_id=f"key-{secrets.token_hex(6)}", tenant=tenant, name=name)
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        await self._put(key_hash(secret), record)
        return secret, record

    async def _put(self, digest: str, record: ApiKey) -> None:
        # Two keys of two slots (no MULTI on a Redis Cluster), written in an order that is safe to stop
        # between: the index first. A crash between leaves an index entry with no key (nothing works
        # with it; `revoke` clears it), never a working key that no list shows and no revoke finds.
        await self._client.hset(self._index, record.key_id, digest)
        await self._client.set(self._by_hash + digest, record.model_dump_json())

    async def export(self) -> list[StoredKey]:
        """Every key with its hash, oldest first: the backup `restore` takes."""
        digests = {text_of(k): text_of(d) for k, d in (await self._client.hgetall(self._index)).items()}
        keys = await self.list()
        return [StoredKey(**key.model_dump(), sha256=digests[key.key_id]) for key in keys if key.key_id in digests]

    async def restore(self, keys: list[StoredKey]) -> int:
        """Put back the exported keys that Redis does not have (by key id); returns how many.

        A key revoked after the export comes back too: revoke it again after a restore."""
        restored = 0
        for key in keys:
            if await self._client.hexists(self._index, key.key_id):
                continue
            await self._put(key.sha256, ApiKey(**key.model_dump(exclude={"sha256"})))
            restored += 1
        return restored

    async def lookup(self, secret: str) -> ApiKey | None:
        return await self.lookup_hash(key_hash(secret))

    async def lookup_hash(self, digest: str) -> ApiKey | None:
        """The key whose secret's SHA-256 is `digest`, None if there is none (revoked, or never made)."""
        raw = await self._client.get(self._by_hash + digest)
        return ApiKey.model_validate_json(raw) if raw else None

    async def revoke(self, key_id: str) -> bool:
        digest = await self._client.hget(self._index, key_id)
        if digest is None:
            return False
        # The key stops working first; its index entry goes after (a crash between: revoke it again).
        await self._client.delete(self._by_hash + text_of(digest))
        await self._client.hdel(self._index, key_id)
        return True

    async def list(self) -> list[ApiKey]:
        digests = await self._client.hgetall(self._index)
        if not digests:
            return []
        async with self._client.pipeline(transaction=False) as pipe:  # keys of many slots: no MGET on a cluster
            for digest in digests.values():
                pipe.get(self._by_hash + text_of(digest))
            raws = await pipe.execute()
        return sorted((ApiKey.model_validate_json(raw) for raw in raws if raw), key=lambda k: k.created_at_ms)


def gateway_key_namespace(topic_prefix: str) -> str:
    """Keys live in the same namespace as the topics (tests and stacks sharing a Redis stay apart)."""
    return f"{topic_prefix}gateway"
