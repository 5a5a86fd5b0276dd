"""Redis-held state shared across restarts: dedupe markers for exactly-once effects."""

from __future__ import annotations

import redis.asyncio as redis
from pydantic import SecretStr
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from llmbus.settings import BusSettings
from llmbus.state.fencing import RequestFence


def reconnect_retry() -> Retry:
    """A command that failed on a broken connection is sent again on a new one, 3 times at most,
    10-500 ms apart (jittered), so a restarted Redis is reconnected to without a failed request."""
    return Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.5), retries=3, supported_errors=(RedisConnectionError,))


def redis_client(
    url: str, max_connections: int = 64, password: SecretStr | None = None, cluster: bool = False
) -> redis.Redis:
    """A client of the Redis at `url`; `password` (Redis AUTH) is kept out of the URL, so out of logs.

    With `cluster`, `url` names one node of a Redis Cluster and the client (RedisCluster) finds the
    others and routes each command by its key's slot. Every script the services run names its keys
    (KEYS) and those keys share a hash tag, so each script runs on one node.
    """
    auth = {"password": password.get_secret_value()} if password is not None else {}
    if cluster:
        # RedisCluster keeps a pool per node (no blocking pool): `max_connections` bounds each one.
        client = redis.RedisCluster.from_url(
            url,
            max_connections=max_connections,
            socket_timeout=5,
            socket_connect_timeout=5,
            decode_responses=False,
            **auth,
        )
        return client  # type: ignore[return-value]  # the same command API as redis.Redis
    # Bounded like every other network call: a dead Redis fails fast instead of hanging. The
    # blocking pool makes a burst of concurrent handlers wait for a connection (up to 5 s)
    # instead of failing with "Too many connections". A pool built here carries no retry (redis-py's
    # own client retries by default; a pool it is given keeps the pool's): after a Redis restart,
    # every pooled connection would fail its next command once ("Connection closed by server").
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=5,
        socket_timeout=5,
        socket_connect_timeout=5,
        retry=reconnect_retry(),
        **auth,
    )
    return redis.Redis(connection_pool=pool, decode_responses=False)


class DedupeStore:
    """Remembers which (request id, step) effects already happened, for a retention window.

    At-least-once delivery redelivers a record whose offset was not committed; checking
    here before acting (and marking after the outputs are acknowledged) makes the effect
    happen once. The window between an ack and the mark is the only duplicate window.
    """

    def __init__(self, client: redis.Redis, namespace: str, ttl_s: int = 7 * 24 * 3600) -> None:
        self._client = client
        self._namespace = namespace
        self._ttl_s = ttl_s

    def _key(self, kind: str, ident: str) -> str:
        return f"llmbus:{self._namespace}:{kind}:{ident}"

    async def any_done(self, *items: tuple[str, str]) -> bool:
        """One round trip for several (kind, ident) checks."""
        return bool(await self._client.exists(*(self._key(kind, ident) for kind, ident in items)))

    async def mark_done(self, kind: str, ident: str, value: str = "1") -> None:
        await self._client.set(self._key(kind, ident), value, ex=self._ttl_s)


def dispatch_markers(client: redis.Redis, topic_prefix: str, final_ttl_s: int | None = None) -> RequestFence:
    """The markers scheduler and workers share: `final:<request id>` (who publishes the result) and
    `fence:<request id>` (the highest attempt placed); see llmbus.state.fencing."""
    ttl_s = final_ttl_s if final_ttl_s is not None else BusSettings().final_marker_ttl_s
    return RequestFence(client, f"{topic_prefix}worker", final_ttl_s=ttl_s)
