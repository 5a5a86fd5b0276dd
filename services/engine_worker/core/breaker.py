"""A circuit breaker for an engine's upstream (pure: the clock is passed in, nothing sleeps).

closed ──N consecutive failures──▶ open ──cooldown──▶ half-open ──probe ok──▶ closed
                                    ▲                     │
                                    └────probe failed─────┘ (cooldown doubled, up to the maximum)

A failure is an upstream 5xx (not 503, which says "busy": the Retry-After cooldown handles it), a
refused or timed-out connection, or a stream the upstream broke. While the breaker is not closed
the worker reports DEGRADED, the scheduler places nothing on it, and a request that reaches it
anyway (placed before the heartbeat arrived) is handed back at once, retryable, without being sent.
Only the worker's own probe runs in half-open: one small request, not a client's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from llmbus_services.engine_worker.core.engine import EngineError


class BreakerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    failure_threshold: int = Field(default=5, ge=1, description="Consecutive upstream failures that open it.")
    cooldown_s: float = Field(default=30.0, gt=0, description="Open this long before the first probe.")
    max_cooldown_s: float = Field(default=300.0, gt=0, description="A failed probe doubles the cooldown up to this.")
    probe: Literal["completion", "models"] = Field(
        default="completion",
        description="completion: a 1-token request (what failed is what is tried); models: GET /models (free, "
        "but many providers answer it while their completions fail).",
    )


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitOpen(EngineError):
    """Refused without sending: the upstream failed repeatedly. Retryable: another worker takes it."""


class CircuitBreaker:
    def __init__(self, config: BreakerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.opened_at_s = 0.0
        self.cooldown_s = config.cooldown_s
        self.last_failure = ""

    @property
    def degraded(self) -> bool:
        return self.state != BreakerState.CLOSED

    def allows_requests(self) -> bool:
        """Clients' requests go upstream only while closed (half-open is for the probe alone)."""
        return self.state == BreakerState.CLOSED

    def seconds_to_probe(self) -> float:
        if self.state != BreakerState.OPEN:
            return 0.0
        return max(0.0, self.opened_at_s + self.cooldown_s - self.clock())

    def start_probe(self) -> bool:
        """Open and its cooldown over: go half-open and return True (the caller probes now)."""
        if self.state != BreakerState.OPEN or self.seconds_to_probe() > 0:
            return False
        self.state = BreakerState.HALF_OPEN
        return True

    def record_success(self) -> None:
        """The upstream answered a whole request: whatever the state, it works again."""
        self.state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.cooldown_s = self.config.cooldown_s

    def record_failure(self, reason: str) -> None:
        self.consecutive_failures += 1
        self.last_failure = reason
        if self.state == BreakerState.HALF_OPEN:
            self.cooldown_s = min(self.cooldown_s * 2, self.config.max_cooldown_s)
            self._open()
        elif self.state == BreakerState.CLOSED and self.consecutive_failures >= self.config.failure_threshold:
            self._open()

    def trip(self, reason: str) -> None:
        """Open now (an upstream that does not answer at start): its probe tells when it does."""
        self.consecutive_failures = max(self.consecutive_failures, self.config.failure_threshold)
        self.last_failure = reason
        self._open()

    def refusal(self) -> CircuitOpen:
        return CircuitOpen(
            f"circuit open after {self.consecutive_failures} consecutive upstream failures "
            f"(last: {self.last_failure[:200]}); probe in {self.seconds_to_probe():.1f} s"
        )

    def _open(self) -> None:
        self.state = BreakerState.OPEN
        self.opened_at_s = self.clock()


@runtime_checkable
class UpstreamHealth(Protocol):
    """An engine whose upstream can fail on its own (openai-http): the worker reports DEGRADED while
    `upstream_degraded`, and calls `probe_upstream_if_due` every little while."""

    @property
    def upstream_degraded(self) -> bool: ...

    async def probe_upstream_if_due(self) -> None: ...
