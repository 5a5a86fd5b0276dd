"""What every fault scenario stands on: a stack of real service processes, private infrastructure
to break, a bounded load, and the wait for answers before the audit reads the namespace back.

Services are `llmbus_tools.harness.service_procs.ServiceProc` processes; a private broker or Redis comes from the
project's own scripts (deploy/kafka/kafka.sh, deploy/redis/redis.sh) on another port and data
dir, so the shared ones are never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from llmbus.audit import AuditReport, audit, read_namespace
from llmbus.bus import Bus, decode
from llmbus.bus.admin import ensure_catalog
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceRequest, InferenceResult
from llmbus.settings import BusSettings
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.reliability.effects import COMPARATOR_ENV, COST_ENV, Effect
from llmbus_tools.harness.reliability.service_rows import service_rows
from llmbus_tools.harness.service_procs import REPO, ServiceProc, drop_namespace, wait_workers_ready

log = logging.getLogger(__name__)
MODEL = "sim-llama-8b"
TENANTS = [f"rel-{i}" for i in range(8)]  # per-tenant rate limits (50/s each) stay out of the way
# Sim workers at high speed-up, heartbeating twice a second.
WORKER_ENV = {"LLMBUS_WORKER_SIM_SPEEDUP": "50", "LLMBUS_WORKER_HEARTBEAT_INTERVAL_S": "0.5"}
SCHEDULER_ENV = {"LLMBUS_SCHEDULER_TICK_MS": "100"}  # a worker is dead after 5 s without a heartbeat (default)
ROUTER_ENV = {"LLMBUS_ROUTER_STATE_CATCH_UP_S": "2"}
# A broker that lives a minute or two: the quick compiler only and the serial collector (a third less CPU
# to start than the default G1 with both compilers).
SHORT_LIVED_BROKER_JVM_FLAGS = "-Xms256m -Xmx768m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:CICompilerCount=1"


@dataclass
class PrivateKafka:
    """A broker of our own (deploy/kafka/kafka.sh on another port and data dir) that a test may stop."""

    run_dir: Path
    port: int = field(default_factory=free_port)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _script(self, action: str) -> None:
        env = os.environ | {
            "KAFKA_PORT": str(self.port),
            "KAFKA_CONTROLLER_PORT": str(free_port()),
            "KAFKA_DATA_DIR": str(self.run_dir / "kafka-data"),
            "KAFKA_RUN_DIR": str(self.run_dir),
            "KAFKA_NAME": f"kafka-{self.port}",
            "KAFKA_READY_TIMEOUT_S": "240",  # a JVM starting on two busy cores
            "KAFKA_BROKER_JVM_FLAGS": SHORT_LIVED_BROKER_JVM_FLAGS,
        }
        subprocess.run([str(REPO / "deploy/kafka/kafka.sh"), action], check=True, env=env, timeout=360)

    def start(self) -> None:
        self._script("start")

    def stop(self) -> None:
        self._script("stop")


@dataclass
class PrivateRedis:
    """A Redis of our own (deploy/redis/redis.sh on another port, append-only file on) that a test may stop."""

    run_dir: Path
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _script(self, action: str) -> None:
        env = os.environ | {
            "REDIS_PORT": str(self.port),
            "REDIS_RUN_DIR": str(self.run_dir),
            "REDIS_NAME": f"redis-{self.port}",
            "REDIS_APPENDONLY": "yes",
        }
        subprocess.run([str(REPO / "deploy/redis/redis.sh"), action], check=True, env=env, timeout=60)

    def start(self) -> None:
        self._script("start")

    def stop(self) -> None:
        self._script("stop")


@dataclass
class Stack:
    """router(s) → scheduler(s) → sim workers, each a ServiceProc; names are stable across restarts."""

    settings: BusSettings
    log_dir: Path
    procs: dict[str, ServiceProc] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)  # stopped on purpose: not restarted by `supervise`
    crashes: list[str] = field(default_factory=list)

    def _add(self, name: str, module: str, env: dict[str, str], settings: BusSettings | None) -> ServiceProc:
        proc = ServiceProc(module, settings or self.settings, env=env, log_dir=self.log_dir, name=name)
        self.procs[name] = proc.start()
        return proc

    def router(self, name: str = "router", env: dict[str, str] | None = None) -> ServiceProc:
        return self._add(name, "llmbus_services.router", ROUTER_ENV | (env or {}), None)

    def scheduler(
        self, name: str = "scheduler", settings: BusSettings | None = None, env: dict[str, str] | None = None
    ) -> ServiceProc:
        # A stable instance id: a restarted scheduler resumes its own outcomes group.
        own = SCHEDULER_ENV | {"LLMBUS_SCHEDULER_INSTANCE_ID": f"{self.settings.topic_prefix}{name}"}
        return self._add(name, "llmbus_services.scheduler", own | (env or {}), settings)

    def worker(
        self, worker_id: str, settings: BusSettings | None = None, env: dict[str, str] | None = None
    ) -> ServiceProc:
        own = WORKER_ENV | {"LLMBUS_WORKER_WORKER_ID": worker_id}
        return self._add(worker_id, "llmbus_services.engine_worker", own | (env or {}), settings)

    def autoscaler(self, env: dict[str, str], name: str = "autoscaler") -> ServiceProc:
        return self._add(name, "llmbus_services.autoscaler", env, None)

    def cost(self, name: str = "cost") -> ServiceProc:
        return self._add(name, "llmbus_services.cost_accounting", COST_ENV, None)

    def comparator(self, name: str = "comparator") -> ServiceProc:
        # Compare and aggregate only: a verdict mid-run would change what the router mirrors.
        return self._add(name, "llmbus_services.shadow_comparator", COMPARATOR_ENV, None)

    def shadow_worker(self, worker_id: str, model: str) -> ServiceProc:
        env = WORKER_ENV | {"LLMBUS_WORKER_WORKER_ID": worker_id, "LLMBUS_WORKER_MODEL": model}
        return self._add(worker_id, "llmbus_services.engine_worker", env, None)

    def kill(self, name: str) -> None:
        """SIGKILL; the service stays down until `restart` (the supervisor leaves it alone)."""
        self.down.add(name)
        self.procs[name].kill()

    def restart(self, name: str) -> None:
        proc = self.procs[name].proc
        assert proc is None or proc.poll() is not None, f"{name} is still running: a second copy would orphan it"
        self.procs[name].start()
        self.down.discard(name)

    def retire(self, name: str) -> None:
        """SIGTERM and wait: a replica removed on purpose (it drains)."""
        self.down.add(name)
        self.procs[name].terminate(60)

    async def supervise(self) -> None:
        """What systemd or Kubernetes does: a service that exits by itself is started again (and noted)."""
        while True:
            await asyncio.sleep(0.5)
            for name, proc in self.procs.items():
                if name not in self.down and proc.proc is not None and proc.proc.poll() is not None:
                    self.crashes.append(f"{name} exited with {proc.proc.returncode}; restarted")
                    log.warning("%s exited with %s; restarting", name, proc.proc.returncode)
                    proc.start()

    def signal(self, name: str, sig: signal.Signals) -> None:
        proc = self.procs[name].proc
        assert proc is not None and proc.poll() is None, f"{name} is not running"
        os.kill(proc.pid, sig)

    def pids(self) -> dict[str, int]:
        return {n: p.proc.pid for n, p in self.procs.items() if p.proc is not None and p.proc.poll() is None}

    def stop_all(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError, OSError):
                if proc.proc is not None and proc.proc.poll() is None:
                    os.kill(proc.proc.pid, signal.SIGCONT)  # a SIGSTOPped one would ignore the kill's wait
            proc.kill()

    def logs(self, lines: int = 25) -> str:
        return "\n".join(f"--- {n} ---\n{p.log_tail(lines)}" for n, p in self.procs.items())


def make_request(i: int, rng: random.Random) -> InferenceRequest:
    """Valid load: varied lengths; one in ten deterministic and repeated (the router's cache answers some)."""
    deterministic = i % 10 == 0
    prompt = f"reliability probe {rng.randrange(20) if deterministic else i}: " + "words " * rng.randrange(4, 60)
    return InferenceRequest(
        tenant=TENANTS[i % len(TENANTS)],
        model=MODEL,
        prompt=prompt,
        max_tokens=rng.randrange(4, 40),
        temperature=0.0 if deterministic else 1.0,
    )


Hook = Callable[[int], Awaitable[None]]


@dataclass
class Load:
    """A bounded stream of requests at a fixed rate; `at(i)` hooks run before request i is sent."""

    settings: BusSettings
    requests: int
    rate_per_s: float
    seed: int = 7
    hooks: dict[int, Hook] = field(default_factory=dict)
    sent_ids: list[str] = field(default_factory=list)

    async def run(self, make: Callable[[int, random.Random], InferenceRequest] = make_request) -> list[str]:
        """Send every request at the rate, whatever the broker does: each is published in a task of
        its own until acknowledged (`Publisher.publish` with the bus's retry time), so a broker or a
        partition leader away only delays acks, and the next requests still go out on time.

        Not `Publisher.send` and its future: while a partition's batch waits for a leader, aiokafka
        lets nothing more into that partition, and a send then fails after request_timeout_ms (what
        a client does then is send again, as `publish` does)."""
        rng = random.Random(self.seed)
        bus = await Bus.start(self.settings, t.CLIENT, client_suffix="-load")
        topic = bus.topics.name(t.REQUESTS)
        started = time.monotonic()
        deliveries: list[asyncio.Task[None]] = []
        retry_s = self.settings.publish_retry_s
        try:
            for i in range(self.requests):
                if (hook := self.hooks.get(i)) is not None:
                    await hook(i)
                request = make(i, rng)
                publish = bus.publisher.publish(topic, request, key=request.request_id, retry_for_s=retry_s)
                deliveries.append(asyncio.create_task(publish))
                self.sent_ids.append(request.request_id)
                if i % 500 == 0:
                    print(f"  sent {i}/{self.requests} at t+{time.monotonic() - started:.1f}s", file=sys.stderr)
                behind_s = (i + 1) / self.rate_per_s - (time.monotonic() - started)
                if behind_s > 0:
                    await asyncio.sleep(behind_s)
            # Every request acknowledged: a record the broker never took was never sent.
            await asyncio.wait_for(asyncio.gather(*deliveries), retry_s + self.settings.send_timeout_s)
        finally:
            for delivery in deliveries:
                delivery.cancel()
            await bus.stop()
        return self.sent_ids


class Answers:
    """Counts distinct request ids answered on llm.results (a tail started before the load)."""

    def __init__(self, settings: BusSettings) -> None:
        self.settings = settings
        self.seen: set[str] = set()
        self._tail: TopicTail | None = None

    async def start(self) -> Answers:
        self._tail = await TopicTail(self.settings, t.Topics(self.settings.topic_prefix).name(t.RESULTS)).start()
        return self

    async def wait(self, ids: list[str], timeout_s: float, settle_s: float = 3.0) -> int:
        """Until every id has a result or the time is up, then `settle_s` more (late doubles show up)."""
        assert self._tail is not None
        wanted = set(ids)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not wanted <= self.seen and loop.time() < deadline:
            await self._read(min(1.0, deadline - loop.time()))
        await self._read(settle_s)
        return len(wanted & self.seen)

    async def _read(self, timeout_s: float) -> None:
        assert self._tail is not None
        async for record in self._tail.records(max(timeout_s, 0.05)):
            self.seen.add(decode(record, InferenceResult).request_id)  # type: ignore[arg-type]

    async def stop(self) -> None:
        if self._tail is not None:
            await self._tail.stop()


ErrorBound = dict[str, int]  # error code -> the most results with it a scenario may end with; absent: 0


def over_bound(report: AuditReport, bound: ErrorBound) -> list[str]:
    """Error results beyond what the scenario allowed before it ran (an error is no answer by itself)."""
    return [
        f"{count} {code} error results, at most {bound.get(code, 0)} allowed"
        for code, count in sorted(report.error_results.items())
        if count > bound.get(code, 0)
    ]


@dataclass
class Outcome:
    """A scenario's verdict: the audit, the error bound fixed before the run, the effects' checks,
    plus what the harness saw (for the report)."""

    scenario: str
    report: AuditReport
    seconds: float
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # the scenario itself did not complete (the audit did not run)
    error_bound: ErrorBound = field(default_factory=dict)
    effect_problems: list[str] = field(default_factory=list)  # downstream effects not exactly once
    services: list[dict[str, object]] = field(default_factory=list)  # llmbus_tools.harness.reliability.service_rows

    @property
    def errors_over_bound(self) -> list[str]:
        return over_bound(self.report, self.error_bound)

    @property
    def passed(self) -> bool:
        return self.error is None and self.report.passed and not self.errors_over_bound and not self.effect_problems

    def verdict(self) -> str:
        lines = [self.report.summary()]
        lines += [f"  over the error bound: {p}" for p in self.errors_over_bound]
        lines += [f"  effect: {p}" for p in self.effect_problems]
        return "\n".join(lines)

    def row(self) -> dict[str, object]:
        return {
            "scenario": self.scenario,
            **self.report.counts(),
            "ok_results": self.report.ok_results,
            "error_results": self.report.error_results,
            "error_bound": self.error_bound,
            "errors_over_bound": self.errors_over_bound,
            "effect_problems": self.effect_problems,
            "dead_letters": self.report.dead_letters,
            "chunk_redeliveries": self.report.chunk_redeliveries,
            "seconds": round(self.seconds, 1),
            "passed": self.passed,
            "error": self.error,
            "notes": self.notes,
            "problems": self.report.problems,
            "services": self.services,
        }


async def dispose(settings: BusSettings) -> None:
    """Drop the namespace, unless LLMBUS_RELIABILITY_KEEP=1 (then `llmbus audit --prefix` can look at it)."""
    if os.environ.get("LLMBUS_RELIABILITY_KEEP") == "1":
        print(f"kept namespace {settings.topic_prefix} on {settings.kafka_bootstrap}", file=sys.stderr)
        return
    await drop_namespace(settings)


async def prepare(settings: BusSettings) -> None:
    await ensure_catalog(settings)


async def finish(
    scenario: str,
    settings: BusSettings,
    stack: Stack,
    answers: Answers,
    sent_ids: list[str],
    started: float,
    *,
    answer_timeout_s: float,
    error_bound: ErrorBound,
    account_requests: bool = False,
    notes: list[str] | None = None,
    effects: list[Effect] | None = None,
) -> Outcome:
    """Wait for the answers (and the effects to settle), then audit everything the namespace holds
    and judge the error results against `error_bound` and each effect's check."""
    load_done = time.monotonic()
    answered = await answers.wait(sent_ids, answer_timeout_s)
    notes = list(notes or [])
    notes.append(f"load sent in {load_done - started:.1f}s; answers awaited {time.monotonic() - load_done:.1f}s")
    for effect in effects or []:
        await effect.settle(answers.seen & set(sent_ids), answer_timeout_s)
    if stack.crashes:
        notes.append(f"services that exited by themselves ({len(stack.crashes)}): {stack.crashes[:10]}")
    notes.append(f"{answered}/{len(sent_ids)} answered within {answer_timeout_s:.0f}s of the last send")
    records = await read_namespace(settings)
    report = audit(t.Topics(settings.topic_prefix), records, sent_ids, account_requests=account_requests)
    effect_problems: list[str] = []
    effects_passed: dict[str, bool] = {}
    for effect in effects or []:
        problems, effect_notes = await effect.check(records)
        effect_problems += problems
        effects_passed[type(effect).__name__] = not problems
        notes += effect_notes
    notes.append(
        f"error results {report.error_results or 'none'}; bound (fixed before the run): {error_bound or 'none'}"
    )
    outcome = Outcome(
        scenario, report, time.monotonic() - started, notes, error_bound=error_bound, effect_problems=effect_problems
    )
    logs = {name: proc.log_path for name, proc in stack.procs.items()}
    delivery_passed = report.passed and not outcome.errors_over_bound
    outcome.services = service_rows(logs, stack.crashes, delivery_passed, effects_passed)
    print(f"{scenario}: {outcome.verdict()}\n  " + "\n  ".join(notes), file=sys.stderr)
    return outcome


async def start_and_wait(stack: Stack, workers: list[str], timeout_s: float = 180) -> None:
    await wait_workers_ready(stack.settings, set(workers), timeout_s)
