"""Test helpers: an isolated topic namespace per test and services run as real processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import redis.asyncio as redis

from llmbus.bus.admin import delete_topics_matching
from llmbus.client import ready_workers
from llmbus.process.launch import bus_env, spawn_module
from llmbus.settings import BusSettings

REPO = Path(__file__).resolve().parents[1]


# Test and bench namespaces look like "t0123456789.": easy to find and drop afterwards.
TEST_NAMESPACE = re.compile(r"^t[0-9a-f]{10}\.")


def fresh_settings(**overrides: object) -> BusSettings:
    """Settings under a namespace no other test uses (topics and groups alike)."""
    return BusSettings(topic_prefix=f"t{uuid.uuid4().hex[:10]}.", log_json=False, **overrides)  # type: ignore[arg-type]


async def drop_namespace(settings: BusSettings) -> None:
    """Delete a test namespace's topics: thousands of leftover partitions slow the broker for everyone."""
    await delete_topics_matching(settings, re.compile(re.escape(settings.topic_prefix)))


@dataclass
class ServiceProc:
    """One service as its own process, with its log kept for the test's report."""

    module: str
    settings: BusSettings
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = Path("/tmp")
    name: str = ""
    cwd: Path = REPO  # another checkout (a benchmark's baseline) runs its own code
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProc:
        self.name = self.name or self.module.rsplit(".", 1)[-1]
        self.log_path = self.log_dir / f"{self.settings.topic_prefix}{self.name}.log"
        env = os.environ | bus_env(self.settings) | self.env
        self.proc = spawn_module(self.module, env=env, log_path=self.log_path, cwd=self.cwd)
        return self

    def kill(self) -> None:
        """SIGKILL: no drain, no commit — what a crash looks like. Its children (vLLM's engine
        processes) go too: a crashed host takes them with it, and orphans would keep busy-polling."""
        if self.proc and self.proc.poll() is None:
            children = psutil.Process(self.proc.pid).children(recursive=True)
            self.proc.kill()
            self.proc.wait(timeout=10)
            for child in children:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()

    def terminate(self, timeout_s: float = 60) -> int:
        """SIGTERM and wait: the graceful path."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        return self.proc.returncode

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except (AttributeError, FileNotFoundError):
            return ""


async def wait_workers_ready(settings: BusSettings, worker_ids: set[str], timeout_s: float = 60) -> None:
    ready = await ready_workers(settings, lambda seen: worker_ids <= seen, timeout_s)
    if not worker_ids <= ready:
        raise TimeoutError(f"workers {worker_ids - ready} not ready within {timeout_s}s")


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


async def wait_http_ok(url: str, timeout_s: float = 90) -> None:
    """Until GET `url` answers 200 (a service's /ready): refused connections and errors count as not yet."""

    async def ok() -> bool:
        async with httpx.AsyncClient() as http:
            with contextlib.suppress(httpx.HTTPError):
                return (await http.get(url, timeout=2)).status_code == 200
        return False

    await eventually(ok, timeout_s=timeout_s, interval_s=0.3)
