"""The gateway under faults: HTTP clients streaming through a gateway process that is SIGKILLed and
restarted mid-run, while they keep sending.

What a client can be promised: a request whose response it saw accepted (HTTP 200 with an
`x-request-id`) gets exactly one result on the bus, and its stream ends either with `[DONE]`, with an
SSE error event, or with the connection broken (the gateway died: a clear error for the client,
never a stream that stops silently as if complete). A request sent while the gateway is down is
refused (connection refused): not accepted, not judged by id.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from llmbus_tools.harness.reliability.load import MODEL, make_request


@dataclass
class HttpLoad:
    """Streaming completions at a fixed rate, each its own HTTP request; what each client saw."""

    base_url: str
    keys: dict[str, str]
    requests: int
    rate_per_s: float
    tenants: list[str]
    seed: int = 7
    accepted: list[str] = field(default_factory=list)  # x-request-id of every 200
    restarted: bool = False  # set once the restarted gateway is ready
    accepted_after_restart: int = 0
    sent: int = 0
    done: int = 0  # streams that ended with [DONE]
    error_events: int = 0  # streams that ended with an SSE error event
    broken: int = 0  # accepted, then the connection broke (the gateway died)
    refused: dict[str, int] = field(default_factory=dict)  # not accepted: why (status or exception)
    silent: list[str] = field(default_factory=list)  # accepted streams that ended without [DONE] or error

    async def _one(self, http: httpx.AsyncClient, i: int, rng: random.Random) -> None:
        request = make_request(i, rng, self.tenants)
        body = {
            "model": MODEL,
            "prompt": request.prompt,
            "max_tokens": 10 * request.max_tokens,  # streams long enough to be cut by the kill
            "temperature": request.temperature,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {self.keys[request.tenant]}"}
        request_id = None
        try:
            async with http.stream("POST", f"{self.base_url}/v1/completions", json=body, headers=headers) as response:
                if response.status_code != 200:
                    self._refuse(f"HTTP {response.status_code}")
                    return
                request_id = response.headers["x-request-id"]
                self.accepted.append(request_id)
                self.accepted_after_restart += self.restarted
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        self.done += 1
                        return
                    if line.startswith("data: ") and "error" in json.loads(line.removeprefix("data: ")):
                        self.error_events += 1
                        return
                self.silent.append(request_id)
        except httpx.HTTPError as exc:
            if request_id is None:
                self._refuse(type(exc).__name__)
            else:
                self.broken += 1

    def _refuse(self, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1

    async def run(
        self, hooks: dict[int, object], until: Callable[[], bool] | None = None, more_within_s: float = 60.0
    ) -> None:
        """`requests` at `rate_per_s`, then, while `until()` is false, more at the same rate for up to
        `more_within_s` (a scenario that needs the load to outlast a restart waits for it, not a window)."""
        rng = random.Random(self.seed)
        started = time.monotonic()
        tasks = []
        limits = httpx.Limits(max_connections=500, max_keepalive_connections=0)  # a new connection each
        async with httpx.AsyncClient(timeout=httpx.Timeout(60, connect=5), limits=limits) as http:
            i = 0
            more_until = float("inf")
            while i < self.requests or (until is not None and not until() and time.monotonic() < more_until):
                if i == self.requests:
                    more_until = time.monotonic() + more_within_s
                if (hook := hooks.get(i)) is not None:
                    await hook(i)  # type: ignore[operator]
                tasks.append(asyncio.create_task(self._one(http, i, rng)))
                i += 1
                behind_s = i / self.rate_per_s - (time.monotonic() - started)
                if behind_s > 0:
                    await asyncio.sleep(behind_s)
            self.sent = i
            await asyncio.gather(*tasks)

    def summary(self) -> str:
        return (
            f"HTTP clients: {self.sent} sent, {len(self.accepted)} accepted ({self.done} [DONE], "
            f"{self.error_events} error events, {self.broken} broken by the kill, {len(self.silent)} silent; "
            f"{self.accepted_after_restart} by the restarted gateway), "
            f"refused {self.refused or 'none'}"
        )
