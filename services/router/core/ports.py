"""What the routing core needs from the outside (Redis, the budgets topic), as Protocols.

The Redis implementations live in services/router/{limits,cache,budgets}.py; unit tests
pass in-memory fakes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from llmbus.contract.messages import BudgetState, FinishReason, InferenceRequest, RoutedRequest, Usage
from llmbus_services.router.core.config import TenantPolicy


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    retry_after_ms: int | None = None
    limit: str | None = None  # which limit said no: "requests" | "tokens"


@dataclass(frozen=True)
class CachedAnswer:
    text: str
    usage: Usage
    model: str
    finish_reason: FinishReason | None = FinishReason.STOP


class RateLimiter(Protocol):
    async def take(self, tenant: str, limits: TenantPolicy, tokens: int) -> RateDecision: ...


class ResponseCache(Protocol):
    async def lookup(self, key: str, pending_id: str | None = None) -> CachedAnswer | None:
        """The answer cached under `key`; on a miss, `pending_id` is remembered as pending for `key`
        (its result fills the entry)."""
        ...


class BudgetView(Protocol):
    def state_of(self, tenant: str) -> BudgetState: ...

    def resets_in_ms(self, tenant: str, now_ms: int) -> int | None:
        """Until the tenant's budget period ends; None when not known."""
        ...


class Coalescer(Protocol):
    async def join(self, key: str, routed: RoutedRequest) -> str | None:
        """None: this request leads (generate it); else the id of the leader it now waits for."""
        ...


@dataclass(frozen=True)
class SemanticProbe:
    answer: CachedAnswer | None
    similarity: float
    vector: npt.NDArray[np.float32]  # the prompt's embedding, indexed later if this request is answered


class SemanticCache(Protocol):
    async def lookup(self, request: InferenceRequest, model: str) -> SemanticProbe: ...

    async def remember_pending(
        self, request_id: str, key: str, tenant: str, model: str, vector: npt.NDArray[np.float32]
    ) -> None: ...
