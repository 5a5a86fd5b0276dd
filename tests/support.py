"""Test helpers: waits with deadlines, Redis key scans, and the sim stack most flow tests start.

Namespaces and service processes come from llmbus_tools.harness.service_procs (benchmarks use them too).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import redis.asyncio as redis

from llmbus.client import TopicTail, collect_results
from llmbus.contract.messages import InferenceRequest, InferenceResult
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import ServiceProc, drop_namespace


def user_request(model: str, rng: random.Random) -> InferenceRequest:
    """One request of many users' steady traffic (the experiment and release tests): a user drawn from
    100,000 (their A/B bucket), a fresh question, a short answer."""
    return InferenceRequest(
        request_id=uuid.uuid4().hex,
        user_id=f"u{rng.randrange(100_000)}",
        model=model,
        prompt=f"question {uuid.uuid4().hex[:8]}: why stream tokens over kafka?",
        max_tokens=12,
        temperature=1.0,
    )


def start_sim_stack(
    settings: BusSettings,
    services: list[ServiceProc],
    log_dir: Path,
    cost_env: dict[str, str],
    router_env: dict[str, str] | None = None,
) -> ServiceProc:
    """cost-accounting, router, scheduler and one sim worker `w1` (20x speed) as processes; the worker back."""
    services.append(ServiceProc("llmbus_services.cost_accounting", settings, env=cost_env, log_dir=log_dir).start())
    services.append(ServiceProc("llmbus_services.router", settings, env=router_env or {}, log_dir=log_dir).start())
    services.append(ServiceProc("llmbus_services.scheduler", settings, log_dir=log_dir).start())
    worker = ServiceProc(
        "llmbus_services.engine_worker",
        settings,
        name="w1",
        log_dir=log_dir,
        env={"LLMBUS_WORKER_WORKER_ID": "w1", "LLMBUS_WORKER_SIM_SPEEDUP": "20"},
    ).start()
    services.append(worker)
    return worker


# Redis SCAN's default COUNT is 10: walking a keyspace of ~20k keys (a shared dev Redis, or one a long
# run filled) that way takes ~2,000 round trips, seconds per test teardown. 1,000 takes ~20.
SCAN_COUNT = 1000


async def redis_keys(client: redis.Redis, pattern: str) -> list[bytes]:
    """The keys matching `pattern` (SCAN, never KEYS: the Redis may be shared with other work)."""
    return [key async for key in client.scan_iter(match=pattern, count=SCAN_COUNT)]


async def drop_keys(client: redis.Redis, pattern: str) -> None:
    """Every key matching `pattern`, one DEL each (on a Redis Cluster the keys are of many slots)."""
    for key in await redis_keys(client, pattern):
        await client.delete(key)


async def until(condition: Callable[[], bool], timeout_s: float = 10, interval_s: float = 0.01) -> None:
    """Wait for a condition on in-process state (no I/O to await), with a deadline."""

    async def check() -> bool:
        return condition()

    await eventually(check, timeout_s=timeout_s, interval_s=interval_s)


async def eventually(predicate, timeout_s: float = 30, interval_s: float = 0.1) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(interval_s)
    raise TimeoutError("condition not met in time")


async def results_then_sentinel(
    settings: BusSettings,
    request_ids: set[str],
    tail: TopicTail,
    send_sentinel: Callable[[], Awaitable[str]],
    timeout_s: float = 60,
) -> dict[str, list[InferenceResult]]:
    """Every result of `request_ids` (on `tail`, started before they were sent) up to a sentinel's.

    Waits until each request has a result, then sends a sentinel request down the same services
    (`send_sentinel` returns its id) and reads on until its result: a second
    result of any request published before the sentinel passed is caught, without a fixed window.
    """
    found = await collect_results(settings, request_ids, timeout_s, tail, until=lambda f: f.keys() == request_ids)
    sentinel_id = await send_sentinel()
    later = await collect_results(
        settings, request_ids | {sentinel_id}, timeout_s, tail, until=lambda f: sentinel_id in f
    )
    assert later.pop(sentinel_id, []), f"no result for the sentinel {sentinel_id} in {timeout_s} s"
    for request_id, more in later.items():
        found.setdefault(request_id, []).extend(more)
    return found


async def gateway_sentinel(base_url: str, api_key: str, model: str) -> str:
    """A short chat completion through a gateway (for `results_then_sentinel`): its request id."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        response = await http.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 2},
            headers={"authorization": f"Bearer {api_key}"},
        )
    response.raise_for_status()
    return response.headers["x-request-id"]


async def wait_http_ok(url: str, timeout_s: float = 90) -> None:
    """Until GET `url` answers 200 (a service's /ready): refused connections and errors count as not yet."""

    async def ok() -> bool:
        async with httpx.AsyncClient() as http:
            with contextlib.suppress(httpx.HTTPError):
                return (await http.get(url, timeout=2)).status_code == 200
        return False

    await eventually(ok, timeout_s=timeout_s, interval_s=0.3)


@contextlib.asynccontextmanager
async def module_stack(procs: list[ServiceProc], settings: BusSettings) -> AsyncIterator[None]:
    """A test module's service processes: their logs printed when the stack fails (coming up or in use),
    every one killed and the namespace dropped at the end."""
    try:
        yield
    except BaseException:
        for proc in procs:
            print(f"\n--- log of {proc.name} ---\n{proc.log_tail()}")
        raise
    finally:
        for proc in procs:
            proc.kill()
        await drop_namespace(settings)
