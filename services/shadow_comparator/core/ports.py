"""What the comparator's core needs from its store (Redis in services/shadow_comparator/adapters/store.py).

The core reaches Redis only through this Protocol, so it stays free of transport code and its
tests can pass an in-memory store.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from llmbus_services.shadow_comparator.core.aggregates import Increments


class RequestLink(NamedTuple):
    """Where an A/B result was counted, and whose request it was."""

    experiment_id: str
    step: int
    variant: str
    tenant: str | None  # None: a link stored before tenants were kept (its feedback counts nowhere)


class PairStore(Protocol):
    async def offer(
        self,
        primary_key: str,
        field: str,
        value: bytes,
        now_ms: int,
        done_id: str | None,
        only_if_waiting: bool = False,
    ) -> tuple[str, dict[str, bytes]]: ...

    async def apply_once(
        self, done_kind: str, done_id: str, agg_key: str, increments: Increments, settle: tuple[str, str] | None = None
    ) -> bool: ...

    def agg_key(self, experiment_id: str, step: int, variant: str) -> str: ...

    async def read_agg(self, experiment_id: str, step: int, variant: str) -> dict[str, float]: ...

    async def remember_request(
        self, request_key: str, experiment_id: str, step: int, variant: str, tenant: str
    ) -> None: ...

    async def request_variant(self, request_key: str, request_id: str) -> RequestLink | None: ...

    async def count(self, **counters: int) -> None: ...

    async def due(self, now_ms: int, limit: int = 500) -> list[str]: ...

    async def sweep_one(self, primary_key: str) -> dict[str, bytes] | None: ...

    async def close(self) -> None: ...
