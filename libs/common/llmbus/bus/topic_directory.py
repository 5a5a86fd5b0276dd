"""Which topics exist, as the broker tells this principal: cached, refreshed on a miss (rate-bounded).

A send to a topic that does not exist waits for metadata until request_timeout_ms; asking
the directory first costs one metadata request per `min_refresh_s` at most, however many
requests name missing topics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from aiokafka import AIOKafkaProducer


class TopicExistence(Protocol):
    async def exists(self, topic: str) -> bool: ...


class TopicDirectory:
    def __init__(self, producer: Callable[[], AIOKafkaProducer], timeout_s: float, min_refresh_s: float = 1.0) -> None:
        self._producer = producer  # the one in use now: a publisher may replace its producer
        self._timeout_s = timeout_s
        self._min_refresh_s = min_refresh_s
        self._known: set[str] = set()
        self._refreshed_at = float("-inf")
        self._lock = asyncio.Lock()

    async def exists(self, topic: str) -> bool:
        if topic in self._known:
            return True
        async with self._lock:
            if topic not in self._known and time.monotonic() - self._refreshed_at >= self._min_refresh_s:
                await self._refresh()
        return topic in self._known

    async def _refresh(self) -> None:
        cluster = await asyncio.wait_for(self._producer().client.fetch_all_metadata(), self._timeout_s)
        self._known = set(cluster.topics())
        self._refreshed_at = time.monotonic()
