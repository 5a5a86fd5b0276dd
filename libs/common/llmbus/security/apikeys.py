"""API keys of the gateway: a key names its tenant; Redis holds only a hash of it.

A key is 256 random bits, so a plain SHA-256 is enough to make a leaked Redis useless
(no dictionary to attack; a slow password hash would only cost every request).
The secret is shown once, at creation; afterwards a key is known by its id.
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
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.set(self._by_hash + digest, record.model_dump_json())
            pipe.hset(self._index, record.key_id, digest)
            await pipe.execute()

    async def export(self) -> list[StoredKey]:
        """Every key with its hash, oldest first: the backup `restore` takes."""
        digests = {_text(k): _text(d) for k, d in (await self._client.hgetall(self._index)).items()}
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
        raw = await self._client.get(self._by_hash + key_hash(secret))
        return ApiKey.model_validate_json(raw) if raw else None

    async def revoke(self, key_id: str) -> bool:
        digest = await self._client.hget(self._index, key_id)
        if digest is None:
            return False
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.delete(self._by_hash + _text(digest))
            pipe.hdel(self._index, key_id)
            await pipe.execute()
        return True

    async def list(self) -> list[ApiKey]:
        digests = await self._client.hgetall(self._index)
        if not digests:
            return []
        raws = await self._client.mget([self._by_hash + _text(d) for d in digests.values()])
        return sorted((ApiKey.model_validate_json(raw) for raw in raws if raw), key=lambda k: k.created_at_ms)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def gateway_key_namespace(topic_prefix: str) -> str:
    """Keys live in the same namespace as the topics (tests and stacks sharing a Redis stay apart)."""
    return f"{topic_prefix}gateway"
