"""The deployments of one hosted model (keys, base URLs, regions), each with its HTTP clients, its limits
(requests and tokens per minute) and its health (a circuit breaker, and the cooldown a 429 / 503 asks
for), and the choice of the deployment that takes the next leg of an answer.

The choice is LiteLLM's router's for a model group (its `model_list` of deployments with `rpm` / `tpm`): of
the deployments that may take a request now (breaker closed, not cooling down, under both limits, not
already failed by this request), the least used, its use being the highest of its request rate, token rate
and streams in flight as fractions of what it allows; ties go to the one listed first.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from llmbus_services.engine_worker.adapters.engines.openai_http_config import DeploymentConfig, OpenAIHttpConfig
from llmbus_services.engine_worker.core.breaker import CircuitBreaker
from llmbus_services.engine_worker.core.engine import EngineDead

WINDOW_S = 60.0  # rpm / tpm are per minute


@dataclass
class Deployment:
    config: DeploymentConfig
    breaker: CircuitBreaker
    clients: list[httpx.AsyncClient] = field(default_factory=list)
    streams_on: list[int] = field(default_factory=list)  # streams open on each client
    cooldown_until_s: float = 0.0  # a 429 / 503 said wait (monotonic)
    _sent: deque[tuple[float, int]] = field(default_factory=deque)  # (when, tokens) of the last minute's legs

    @property
    def name(self) -> str:
        return self.config.name or ""

    @property
    def in_flight(self) -> int:
        return sum(self.streams_on)

    def start(self, entry: OpenAIHttpConfig, transport: httpx.AsyncBaseTransport | None) -> None:
        """HTTP clients for max_num_seqs concurrent streams, each with a small pool kept alive.

        One client for all of them cost the worker most of its CPU at 64 streams (a CPU profile at
        c = 64, bench/reports/pipeline_profile.md): httpcore looks at every connection of its pool
        each time it places a request or one ends (O(connections) each time), and by default it
        keeps only 20 connections alive, so the streams beyond closed their connection after every
        request and opened a new one for the next. Small pools, all kept alive, fix both; a request
        goes to the client with the fewest open streams, so none waits for a connection.
        """
        c = self.config
        headers = dict(c.extra_headers or {})
        key = c.api_key or ""
        if c.api_key_env:
            key = os.environ.get(c.api_key_env, "")
            if not key:
                raise EngineDead(f"environment variable {c.api_key_env} holds no API key ({self.name})")
        if key:
            header = c.api_key_header or "Authorization"
            headers[header] = f"Bearer {key}" if header.lower() == "authorization" else key
        per_pool = max(1, entry.connections_per_pool)
        # Reads are timed by the engine (first token, stalls), not per socket read.
        timeout = httpx.Timeout(
            connect=entry.connect_timeout_s, read=None, write=entry.stall_timeout_s, pool=entry.connect_timeout_s
        )
        self.clients = [
            httpx.AsyncClient(
                base_url=(c.base_url or "").rstrip("/"),
                headers=headers,
                params=c.extra_query or {},
                timeout=timeout,
                limits=httpx.Limits(max_connections=per_pool, max_keepalive_connections=per_pool),
                transport=transport,
            )
            for _ in range(max(1, -(-entry.max_num_seqs // per_pool)))
        ]
        self.streams_on = [0] * len(self.clients)

    def least_busy_client(self) -> int:
        if not self.clients:
            raise EngineDead("openai-http engine is not started")
        return min(range(len(self.clients)), key=self.streams_on.__getitem__)

    # -- limits and health -----------------------------------------------------------------------
    def _forget_before(self, now_s: float) -> None:
        while self._sent and self._sent[0][0] <= now_s - WINDOW_S:
            self._sent.popleft()

    def use(self, now_s: float, tokens: int, max_num_seqs: int) -> float:
        """How much of what it allows this deployment uses (0..1, and over 1 when a leg would pass a limit)."""
        self._forget_before(now_s)
        fractions = [self.in_flight / max(1, max_num_seqs)]
        if self.config.rpm:
            fractions.append((len(self._sent) + 1) / self.config.rpm)
        if self.config.tpm:
            fractions.append((sum(t for _, t in self._sent) + tokens) / self.config.tpm)
        return max(fractions)

    def limit_frees_in_s(self, now_s: float, tokens: int) -> float:
        """Until a leg of `tokens` fits its rpm and tpm (0: now)."""
        self._forget_before(now_s)
        waits = [0.0]
        rpm, tpm = self.config.rpm, self.config.tpm
        if rpm and len(self._sent) + 1 > rpm:
            waits.append(self._sent[len(self._sent) - rpm][0] + WINDOW_S - now_s)
        if tpm:
            used = sum(t for _, t in self._sent) + tokens
            for when, spent in self._sent:
                if used <= tpm:
                    break
                used -= spent
                waits.append(when + WINDOW_S - now_s)
        return max(waits)

    def sent(self, now_s: float, tokens: int) -> None:
        self._sent.append((now_s, tokens))

    def available(self, now_s: float) -> bool:
        return self.breaker.allows_requests() and now_s >= self.cooldown_until_s

    def busy_for(self, now_s: float, retry_after_s: float) -> None:
        self.cooldown_until_s = max(self.cooldown_until_s, now_s + retry_after_s)

    async def stop(self) -> None:
        clients, self.clients = self.clients, []
        for client in clients:
            await client.aclose()


class DeploymentPool:
    def __init__(
        self,
        entry: OpenAIHttpConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.entry = entry
        self.clock = clock
        self.deployments = [Deployment(d, CircuitBreaker(entry.breaker, clock)) for d in entry.resolved_deployments()]

    def start(self, transport: httpx.AsyncBaseTransport | None) -> None:
        for deployment in self.deployments:
            deployment.start(self.entry, transport)

    async def stop(self) -> None:
        for deployment in self.deployments:
            await deployment.stop()

    @property
    def started(self) -> bool:
        return bool(self.deployments[0].clients)

    @property
    def degraded(self) -> bool:
        """Every deployment's breaker open (or probing): the worker takes nothing."""
        return all(d.breaker.degraded for d in self.deployments)

    def choose(
        self,
        tokens: int,
        excluded: set[str],
        not_before: dict[str, float],
        tries: dict[str, int],
        fits: Callable[[Deployment], bool],
    ) -> tuple[Deployment | None, float | None]:
        """The deployment for a leg of `tokens` now: of those not `excluded` that `fit` and may take it (breaker
        closed, cooldown over, under their limits, past this request's own `not_before`), the least tried by
        this request, then the least used. None now: (None, seconds until the first may), or (None, None)
        when none ever may."""
        now_s = self.clock()
        max_num_seqs = self.entry.max_num_seqs
        ready: list[Deployment] = []
        later: list[float] = []
        for d in self.deployments:
            if d.name in excluded or not fits(d) or not d.breaker.allows_requests():
                continue
            ready_at = max(not_before.get(d.name, 0.0), d.cooldown_until_s, now_s + d.limit_frees_in_s(now_s, tokens))
            if ready_at <= now_s:
                ready.append(d)
            else:
                later.append(ready_at - now_s)
        if ready:  # min keeps the first of equals: the order of the file
            return min(ready, key=lambda d: (tries.get(d.name, 0), d.use(now_s, tokens, max_num_seqs))), 0.0
        return None, (min(later) if later else None)

    def free_in_s(self, tokens: int) -> float | None:
        """Until some deployment may take a leg of `tokens` (its cooldown, limits or breaker's probe); None
        when none can say (every breaker open, its probe due)."""
        now_s = self.clock()
        waits = [
            max(d.cooldown_until_s - now_s, d.limit_frees_in_s(now_s, tokens), d.breaker.seconds_to_probe())
            for d in self.deployments
            if d.breaker.allows_requests() or d.breaker.seconds_to_probe() > 0
        ]
        return max(0.0, min(waits)) if waits else None
