"""Benchmarks' and tests' stacks: an isolated topic namespace per run and services run as real processes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from llmbus.bus.admin import delete_topics_matching
from llmbus.client import ready_workers
from llmbus.process.launch import bus_env, spawn_module
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_tools.harness.forkserver import ForkedProcess, server_for

REPO = Path(__file__).resolve().parents[2]


# Test and bench namespaces look like "t0123456789.": easy to find and drop afterwards.
TEST_NAMESPACE = re.compile(r"^t[0-9a-f]{10}\.")


def fresh_settings(**overrides: object) -> BusSettings:
    """Settings under a namespace no other test uses (topics and groups alike)."""
    return BusSettings(topic_prefix=f"t{uuid.uuid4().hex[:10]}.", log_json=False, **overrides)  # type: ignore[arg-type]


async def drop_namespace(settings: BusSettings) -> None:
    """Delete a test namespace's topics: thousands of leftover partitions slow the broker for everyone."""
    await delete_topics_matching(settings, re.compile(re.escape(settings.topic_prefix)))


# Their Redis keys: `{<namespace>cost}:…` (cost-accounting's), `llmbus:<namespace>…` or
# `llmbus:{<namespace>…` (the other services', hash-tagged or not), `<namespace>cost:…` (from before the
# tags), and `llmbus:test-<hex>:…` (the Redis-only tests' namespaces).
TEST_KEY = re.compile(rf"^(llmbus:)?\{{?({TEST_NAMESPACE.pattern.removeprefix('^')}|test-[0-9a-f]{{10}}:)".encode())


async def drop_test_keys(redis_url: str, batch: int = 1000) -> int:
    """Delete the keys of every test and bench namespace in a Redis; how many it deleted.

    Their markers keep TTLs of days, and a dev Redis persists them (AOF): each later run's SCANs
    (the services' own and the tests' teardowns) would walk every key of every earlier run."""
    client = redis_client(redis_url)
    doomed: list[bytes] = []
    dropped = 0
    try:
        async for key in client.scan_iter(count=10_000):
            if TEST_KEY.match(key):
                doomed.append(key)
            if len(doomed) >= batch:
                dropped += await client.unlink(*doomed)
                doomed.clear()
        if doomed:
            dropped += await client.unlink(*doomed)
    finally:
        await client.aclose()
    return dropped


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


@dataclass
class ServiceProc:
    """One service as its own process, with its log kept for the test's report."""

    module: str
    settings: BusSettings
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = Path("/tmp")
    name: str = ""
    cwd: Path = REPO  # another checkout (a benchmark's baseline) runs its own code
    proc: subprocess.Popen[bytes] | ForkedProcess | None = None

    def start(self) -> ServiceProc:
        self.name = self.name or self.module.rsplit(".", 1)[-1]
        self.log_path = self.log_dir / f"{self.settings.topic_prefix}{self.name}.log"
        env = os.environ | bus_env(self.settings) | self.env
        server = server_for(env, self.cwd, python_args=())
        if server is not None:  # the tests' fork server: the same process, without paying its imports again
            self.proc = server.spawn(self.module, env=env, log_path=self.log_path)
        else:
            self.proc = spawn_module(self.module, env=env, log_path=self.log_path, cwd=self.cwd)
        return self

    def kill(self) -> None:
        """SIGKILL: no drain, no commit — what a crash looks like. Its children in its own session
        (vLLM's engine processes) go too: a crashed host takes them with it, and orphans would keep
        busy-polling. Processes it started in a session of their own (the autoscaler's detached
        workers) outlive it, as they would a crash of that process alone."""
        if self.proc and self.proc.poll() is None:
            session = os.getsid(self.proc.pid)
            children = [
                child
                for child in psutil.Process(self.proc.pid).children(recursive=True)
                if _session_of(child.pid) == session
            ]
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
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except (AttributeError, FileNotFoundError):
            return ""


async def wait_workers_ready(settings: BusSettings, worker_ids: set[str], timeout_s: float = 60) -> None:
    ready = await ready_workers(settings, lambda seen: worker_ids <= seen, timeout_s)
    if not worker_ids <= ready:
        raise TimeoutError(f"workers {worker_ids - ready} not ready within {timeout_s}s")
