"""The autoscaler on the real broker with the local actuator (timings compressed through its YAML).

Scheduler and autoscaler (and the router, for the burst) run as processes; the autoscaler starts and
drains real sim engine-workers. A prefill-heavy burst scales the pool on the latency trigger while queue
wait stays low (the second test). The first walks a pool through a whole tide:
1. at zero, a request arrives: one worker is started and the request is served after its cold start;
2. a step of load a single worker cannot carry: the queue wait rises, the pool grows, and the
   queue wait falls back under 300 ms while the load goes on;
3. idle: the pool shrinks to its minimum, zero, and the workers drain (SIGTERM) and stop;
4. a request at zero again is served after a cold start;
and every request gets exactly one result, an ok one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from llmbus.bus import Bus, decode
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    InferenceRequest,
    InferenceResult,
    PoolStats,
    ResultStatus,
    RoutedRequest,
    ScaleDecision,
    WorkerState,
    WorkerStatus,
    now_ms,
)
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready
from tests.support import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow]
POOL = "sim-llama-8b"
TARGET_MS = 300.0


class Collector:
    """Everything published on a few topics during the test, decoded, with when it was read."""

    def __init__(self, settings: BusSettings) -> None:
        self.settings = settings
        self.topics = t.Topics(settings.topic_prefix)
        self.results: dict[str, list[InferenceResult]] = {}
        self.decisions: list[ScaleDecision] = []
        self.stats: list[tuple[float, PoolStats]] = []
        self.workers: dict[str, list[WorkerState]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._tails: list[TopicTail] = []

    async def start(self) -> Collector:
        for base, handle in (
            (t.RESULTS, self._result),
            (t.SCALING, self._decision),
            (t.POOL_STATS, self._stats),
            (t.WORKERS, self._worker),
        ):
            tail = await TopicTail(self.settings, self.topics.name(base)).start()
            self._tails.append(tail)
            self._tasks.append(asyncio.create_task(self._follow(tail, handle)))
        return self

    async def _follow(self, tail: TopicTail, handle) -> None:  # type: ignore[no-untyped-def]
        while True:
            async for record in tail.records(1.0):
                handle(record)

    def _result(self, record) -> None:  # type: ignore[no-untyped-def]
        result = decode(record, InferenceResult)
        self.results.setdefault(result.request_id, []).append(result)

    def _decision(self, record) -> None:  # type: ignore[no-untyped-def]
        self.decisions.append(decode(record, ScaleDecision))

    def _stats(self, record) -> None:  # type: ignore[no-untyped-def]
        self.stats.append((time.monotonic(), decode(record, PoolStats)))

    def _worker(self, record) -> None:  # type: ignore[no-untyped-def]
        status = decode(record, WorkerStatus)
        states = self.workers.setdefault(status.worker_id, [])
        if not states or states[-1] != status.state:
            states.append(status.state)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for tail in self._tails:
            await tail.stop()


def pools_file(path: Path) -> Path:
    spec = {
        "pools": {
            POOL: {
                "min_replicas": 0,
                "max_replicas": 4,
                "policy": {
                    "type": "threshold",
                    "params": {
                        "target_queue_wait_ms": TARGET_MS,
                        "up_after_s": 3,
                        "idle_after_s": 6,
                        "cooldown_s": 4,
                        "step_up": 1,
                    },
                },
                "local": {
                    "engine": "sim",
                    "stop_grace_s": 30,
                    "env": {"LLMBUS_WORKER_SIM_MAX_NUM_SEQS": "2", "LLMBUS_WORKER_HEARTBEAT_INTERVAL_S": "0.5"},
                },
            }
        }
    }
    path.write_text(yaml.safe_dump(spec))
    return path


async def send(bus: Bus, max_tokens: int) -> str:
    request = InferenceRequest(prompt="tell me about tides " * 8, max_tokens=max_tokens, model=POOL)
    routed = RoutedRequest(request=request, model=POOL)
    await bus.publisher.publish(bus.topics.name(t.ROUTED), routed, key=POOL, request_id=request.request_id)
    return request.request_id


@contextlib.asynccontextmanager
async def stack(settings: BusSettings, services: list[ServiceProc], tmp_path: Path) -> AsyncIterator[Bus]:
    services.append(
        ServiceProc(
            "llmbus_services.scheduler",
            settings,
            env={"LLMBUS_SCHEDULER_POOL_STATS_INTERVAL_S": "1", "LLMBUS_SCHEDULER_NO_WORKER_TIMEOUT_S": "120"},
        ).start()
    )
    services.append(
        ServiceProc(
            "llmbus_services.autoscaler",
            settings,
            env={
                "LLMBUS_CACHE": str(tmp_path / "cache"),  # the local actuator's run dir: pid and log files
                "LLMBUS_AUTOSCALER_POOLS": str(pools_file(tmp_path / "pools.yaml")),
                "LLMBUS_AUTOSCALER_ACTUATOR": "local",
                "LLMBUS_WORKER_SIM_SPEEDUP": "1",
            },
        ).start()
    )
    bus = await Bus.start(settings, "test")
    try:
        yield bus
    finally:
        await bus.stop()


def live_pids(tmp_path: Path) -> list[int]:
    alive = []
    for pid_file in (tmp_path / "cache" / "run").glob(f"{POOL}-as*.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), 0)
            alive.append(int(pid_file.read_text()))
    return alive


async def test_pool_grows_on_queue_wait_shrinks_to_zero_with_drain_and_wakes_again(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    seen = await Collector(bus_settings).start()
    sent: list[str] = []
    try:
        async with stack(bus_settings, services, tmp_path) as bus:
            # 1. zero → one worker, the waiting request is served after the cold start
            sent.append(await send(bus, 20))
            # generous: on a loaded 2-core machine the services themselves take a while to start
            await eventually(lambda: _has_result(seen, sent), timeout_s=240, interval_s=0.5)
            wake = seen.decisions[0]
            assert (wake.current_replicas, wake.desired_replicas, wake.action) == (0, 1, "up")
            assert "cold start" in wake.reason and wake.policy == "threshold" and wake.actuator == "local"

            # 2. a step of load: ~1.25 requests/s of ~2 s each; one worker runs 2 at once (~1/s)
            # The load runs until the tide has turned (at most 60 sends, 48 s, as it did at a fixed length):
            # queue wait went over target, the pool grew to >= 2 on it, and after the last scale-up so far
            # queue wait came back under target. Judged on one snapshot, taken while the load still runs.
            step_started = time.monotonic()
            for _ in range(60):
                sent.append(await send(bus, 300))
                await asyncio.sleep(0.8)
                if _tide_turned(seen, step_started):
                    break
            assert _tide_turned(seen, step_started), _tide_summary(seen, step_started)

            # 3. idle: down to the minimum (zero), the workers drain and exit
            await eventually(lambda: _has_result(seen, sent), timeout_s=120, interval_s=0.5)
            await eventually(
                lambda: _async(any(d.desired_replicas == 0 and d.action == "down" for d in seen.decisions)),
                timeout_s=60,
                interval_s=0.5,
            )
            await eventually(lambda: _async(not live_pids(tmp_path)), timeout_s=60, interval_s=0.5)
            scaled = [w for w in seen.workers if w.startswith(f"{POOL}-as")]
            assert len(scaled) >= 2
            for worker_id in scaled:
                states = seen.workers[worker_id]
                assert WorkerState.DRAINING in states and states[-1] == WorkerState.STOPPED, (worker_id, states)

            # 4. a request at zero again: one cold start, then served
            down_at = len(seen.decisions)
            woke_at = time.monotonic()
            sent.append(await send(bus, 20))
            await eventually(lambda: _has_result(seen, sent), timeout_s=90, interval_s=0.5)
            assert time.monotonic() - woke_at > 1.0  # it waited for a worker to start
            # (with timings this compressed, more workers may follow while the request waits out the cold start)
            assert any((d.current_replicas, d.desired_replicas) == (0, 1) for d in seen.decisions[down_at:])
    finally:
        await seen.stop()
        for pid in live_pids(tmp_path):  # workers the autoscaler started and still runs
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in reversed(services):
            with contextlib.suppress(Exception):
                proc.terminate(timeout_s=40)  # the autoscaler leaves its workers; the fixture kills the rest
    # nothing lost: exactly one result per request, all ok
    assert set(seen.results) == set(sent)
    assert all(len(seen.results[r]) == 1 for r in sent)
    assert all(seen.results[r][0].status == ResultStatus.OK for r in sent)


def _ups_after_wake(seen: Collector) -> list[ScaleDecision]:
    return [d for d in seen.decisions[1:] if d.action == "up"]


def _back_under(seen: Collector, ups: list[ScaleDecision]) -> list[PoolStats]:
    """Pool statistics sent after the last scale-up in `ups` with workers placed and queue wait under target."""
    last_up = max(d.decided_at_ms for d in ups) / 1000
    return [
        s
        for _, s in seen.stats
        if s.sent_at_ms / 1000 > last_up and s.placed and (s.queue_wait_ms_p50 or 0) < TARGET_MS
    ]


def _tide_turned(seen: Collector, step_started: float) -> bool:
    ups = _ups_after_wake(seen)
    return (
        bool(ups)
        and max(d.desired_replicas for d in ups) >= 2
        and any("median queue wait" in d.reason for d in ups)
        and any((s.queue_wait_ms_p50 or 0) > TARGET_MS for at, s in seen.stats if at > step_started)
        and bool(_back_under(seen, ups))
    )


def _tide_summary(seen: Collector, step_started: float) -> str:
    ups = _ups_after_wake(seen)
    return f"ups {[(d.desired_replicas, d.reason) for d in ups]}; last stats {[s for _, s in seen.stats][-5:]}"


async def _async(value: bool) -> bool:
    return value


async def _has_result(seen: Collector, sent: list[str]) -> bool:
    return all(r in seen.results for r in sent)


PREFILL_TOKENS = 2000  # a code-completion shape: long prompts, a few tokens out (the sim counts 4 characters a token)


def longest_over_ms(stats: list[PoolStats], target_ms: float) -> int:
    """The longest stretch of consecutive windows whose median queue wait was at or over the target, from the
    first such window's start to the last one's end."""
    longest, start_ms = 0, None
    for s in sorted(stats, key=lambda s: s.window_start_ms):
        if (s.queue_wait_ms_p50 or 0) >= target_ms:
            start_ms = s.window_start_ms if start_ms is None else start_ms
            longest = max(longest, s.window_start_ms + int(s.window_s * 1000) - start_ms)
        else:
            start_ms = None
    return longest


def latency_pools_file(path: Path) -> Path:
    """The threshold policy with its latency trigger in seconds: p99 TTFT over 2 s for 5 s → +1. Its
    workers are slow at prefill (the A100 profile at a quarter of real time: ~2.5 prompts of 2,000 tokens
    a second) and have 256 batch slots, so a burst waits inside the engine, not in the scheduler's queue."""
    spec = {
        "pools": {
            POOL: {
                "min_replicas": 1,
                "max_replicas": 3,
                "policy": {
                    "type": "threshold",
                    "params": {
                        "target_queue_wait_ms": TARGET_MS,
                        "up_after_s": 5,
                        "ttft_target_ms": 2000,
                        "latency_up_after_s": 5,
                        "min_ttft_samples": 3,
                        "idle_after_s": 600,
                        "cooldown_s": 60,
                    },
                },
                "local": {
                    "engine": "sim",
                    "stop_grace_s": 30,
                    "env": {
                        "LLMBUS_WORKER_SIM_PROFILE": "llama-3.1-8b-a100",
                        "LLMBUS_WORKER_SIM_SPEEDUP": "0.25",
                        "LLMBUS_WORKER_HEARTBEAT_INTERVAL_S": "0.5",
                    },
                },
            }
        }
    }
    path.write_text(yaml.safe_dump(spec))
    return path


async def test_prefill_heavy_burst_scales_up_on_the_latency_trigger_while_queue_wait_stays_low(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    """Router, scheduler and the autoscaler (its local actuator starts the pool's sim workers): a burst of
    2,000-token prompts is placed at once (queue wait under 300 ms in every window) and waits inside the
    one worker's engine behind the other prompts' prefill; p99 TTFT goes over 2 s, the latency trigger
    adds a worker, the new worker serves, and every request gets one ok result."""
    seen = await Collector(bus_settings).start()
    sent: list[str] = []
    env = {"LLMBUS_SCHEDULER_POOL_STATS_INTERVAL_S": "1", "LLMBUS_SCHEDULER_POOL_STATS_LATENCY_WINDOW_S": "10"}
    services.append(ServiceProc("llmbus_services.router", bus_settings).start())
    services.append(ServiceProc("llmbus_services.scheduler", bus_settings, env=env).start())
    autoscaler_env = {
        "LLMBUS_CACHE": str(tmp_path / "cache"),  # the local actuator's run dir: pid and log files
        "LLMBUS_AUTOSCALER_POOLS": str(latency_pools_file(tmp_path / "pools.yaml")),
        "LLMBUS_AUTOSCALER_ACTUATOR": "local",
    }
    services.append(ServiceProc("llmbus_services.autoscaler", bus_settings, env=autoscaler_env).start())
    bus = await Bus.start(bus_settings, "test")
    try:
        await wait_workers_ready(bus_settings, {f"{POOL}-as1"}, timeout_s=240)  # the pool's minimum, at start
        burst_started_ms = now_ms()

        def scaled_on_latency() -> list[ScaleDecision]:
            return [d for d in seen.decisions if d.action == "up" and "p99 TTFT" in d.reason]

        for n in range(400):  # 3 prompts a second (one worker prefills ~2.5) until the added worker serves
            prompt = f"request {n}: " + "def tide(x): return x * 2\n" * (PREFILL_TOKENS * 4 // 26)
            request = InferenceRequest(prompt=prompt, max_tokens=8, model=POOL)
            await bus.publisher.publish(
                bus.topics.name(t.REQUESTS), request, key=request.request_id, request_id=request.request_id
            )
            sent.append(request.request_id)
            await asyncio.sleep(1 / 3)
            served_by_new = any(r[0].worker_id == f"{POOL}-as2" for r in seen.results.values())
            if scaled_on_latency() and served_by_new:
                break
        await eventually(lambda: _has_result(seen, sent), timeout_s=240, interval_s=0.5)
    finally:
        await bus.stop()
        await seen.stop()
        for pid in live_pids(tmp_path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in reversed(services):
            with contextlib.suppress(Exception):
                proc.terminate(timeout_s=40)
    (up, *_) = scaled_on_latency() or [None]
    assert up is not None, [(d.action, d.reason) for d in seen.decisions]
    assert (up.current_replicas, up.desired_replicas, up.policy) == (1, 2, "threshold")
    assert up.signals["ttft_ms_p99"] > 2000 and up.signals["queue_wait_ms"] < TARGET_MS, up.signals
    assert not any("queue wait" in d.reason for d in seen.decisions if d.action == "up")
    # Queue wait stayed low until the latency trigger fired: in the windows of the burst up to the decision
    # its median was under the target, and it never stayed over it for the rule's up_after_s (5 s), so the
    # queue-wait trigger alone would never have scaled. (One window over it is a request that met a busy
    # scheduler on a loaded machine; the rule needs 5 s of them. After the decision, the added worker's cold
    # start may let a queue form: that is what the scale-up answers.)
    burst = [s for _, s in seen.stats if s.pool == POOL and s.sent_at_ms >= burst_started_ms and s.placed]
    before_up = [s for s in burst if s.sent_at_ms <= up.decided_at_ms]
    waits = [(s.sent_at_ms - up.decided_at_ms, s.queue_wait_ms_p50) for s in burst]
    assert before_up and statistics.median(s.queue_wait_ms_p50 or 0 for s in before_up) < TARGET_MS, waits
    assert longest_over_ms(before_up, TARGET_MS) < 5_000, waits
    assert any(s.prefill_backlog_tokens > PREFILL_TOKENS for s in burst)  # the engines' own count, in the stats
    assert any(r[0].worker_id == f"{POOL}-as2" for r in seen.results.values())  # the added worker served
    assert set(seen.results) >= set(sent)
    assert all(len(seen.results[r]) == 1 and seen.results[r][0].status == ResultStatus.OK for r in sent)
