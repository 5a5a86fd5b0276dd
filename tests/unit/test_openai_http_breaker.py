"""The upstream circuit breaker: its state machine on an injected clock, and the engine that keeps it.

The engine half runs against httpx.MockTransport (an in-memory upstream); the same behaviour on a
real HTTP server, a real worker and the real broker is tests/integration/test_openai_http_worker.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import pytest

from llmbus.contract.messages import ErrorCode, WorkerState, WorkerStatus
from llmbus_services.engine_worker.adapters.engines.openai_http import OpenAIHttpConfig, OpenAIHttpEngine
from llmbus_services.engine_worker.core.breaker import BreakerConfig, BreakerState, CircuitBreaker
from llmbus_services.engine_worker.core.engine import EngineRequest, RequestRejected, UpstreamBusy, UpstreamFailed
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.scheduler import CoreConfig, FinalError, PlaceAction, SchedulerCore
from llmbus_services.scheduler.core.types import SchedRequest
from tests.unit.test_sched_fallback import routed


@dataclass
class Clock:
    now_s: float = 100.0

    def __call__(self) -> float:
        return self.now_s


def breaker(threshold: int = 3, cooldown_s: float = 10.0, max_cooldown_s: float = 35.0) -> tuple[CircuitBreaker, Clock]:
    clock = Clock()
    config = BreakerConfig(failure_threshold=threshold, cooldown_s=cooldown_s, max_cooldown_s=max_cooldown_s)
    return CircuitBreaker(config, clock), clock


def test_opens_after_n_consecutive_failures_only() -> None:
    b, _ = breaker(threshold=3)
    b.record_failure("500")
    b.record_failure("500")
    b.record_success()  # a success in between: the count starts again
    b.record_failure("500")
    b.record_failure("500")
    assert b.state == BreakerState.CLOSED and b.allows_requests() and not b.degraded
    b.record_failure("connection refused")
    assert b.state == BreakerState.OPEN and b.degraded and not b.allows_requests()
    assert "3 consecutive" in str(b.refusal()) and "connection refused" in str(b.refusal())


def test_half_open_after_the_cooldown_and_a_good_probe_closes_it() -> None:
    b, clock = breaker(cooldown_s=10.0)
    for _ in range(3):
        b.record_failure("500")
    clock.now_s += 9.9
    assert not b.start_probe() and b.seconds_to_probe() == pytest.approx(0.1)
    clock.now_s += 0.1
    assert b.start_probe()
    assert b.state == BreakerState.HALF_OPEN and b.degraded and not b.allows_requests()  # the probe alone
    assert not b.start_probe()  # one probe at a time
    b.record_success()
    assert b.state == BreakerState.CLOSED and b.allows_requests() and b.consecutive_failures == 0


def test_a_failed_probe_reopens_with_a_doubled_cooldown_up_to_the_maximum() -> None:
    b, clock = breaker(cooldown_s=10.0, max_cooldown_s=35.0)
    for _ in range(3):
        b.record_failure("500")
    waits = []
    for _ in range(4):
        clock.now_s += b.seconds_to_probe()
        assert b.start_probe()
        b.record_failure("probe: 500")
        assert b.state == BreakerState.OPEN
        waits.append(b.seconds_to_probe())
    assert waits == [20.0, 35.0, 35.0, 35.0]
    clock.now_s += 35.0
    assert b.start_probe()
    b.record_success()
    for _ in range(3):  # closed again: the next opening starts from the configured cooldown
        b.record_failure("500")
    assert b.seconds_to_probe() == 10.0


def test_breaker_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="failure_threshold"):
        BreakerConfig(failure_threshold=0)
    with pytest.raises(ValueError, match="extra"):
        BreakerConfig.model_validate({"cooldown_s": 1, "cooldwn_s": 2})


# -- the engine keeps the breaker --------------------------------------------------------------


class Upstream:
    """An in-memory OpenAI-compatible upstream whose answer status can be changed."""

    def __init__(self) -> None:
        self.status = 200
        self.finish_reason = "stop"
        self.bodies: list[dict] = []
        self.paths: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if request.method == "POST":
            self.bodies.append(json.loads(request.content))
        if self.status == -1:
            raise httpx.ConnectError("connection refused", request=request)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "upstream says no"}})
        if request.method == "GET" or not self.bodies[-1].get("stream"):
            return httpx.Response(200, json={"choices": [{"message": {"content": "."}}], "data": []})
        chunks = [
            {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": self.finish_reason}]},
            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
        ]
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})


async def engine_on(upstream: Upstream, clock: Clock, **config: object) -> OpenAIHttpEngine:
    cfg = OpenAIHttpConfig(base_url="http://up.test/v1", model="m", **config)  # type: ignore[arg-type]
    engine = OpenAIHttpEngine(cfg, httpx.MockTransport(upstream.handler), clock)
    await engine.start()
    return engine


async def ask(engine: OpenAIHttpEngine, rid: str = "r") -> str:
    return "".join([o.delta async for o in engine.generate(EngineRequest(rid, "hi", max_tokens=4))])


async def test_engine_opens_on_5xx_and_connection_errors_refuses_unsent_and_recovers_by_probe() -> None:
    upstream, clock = Upstream(), Clock()
    config = {"breaker": BreakerConfig(failure_threshold=2, cooldown_s=5.0), "retries": 0}
    engine = await engine_on(upstream, clock, **config)
    breaker = engine.pool.deployments[0].breaker
    upstream.status = 500
    with pytest.raises(UpstreamFailed, match="HTTP 500"):
        await ask(engine)
    upstream.status = -1
    with pytest.raises(UpstreamFailed, match="unreachable"):
        await ask(engine)
    assert engine.upstream_degraded
    sent = len(upstream.bodies)
    with pytest.raises(UpstreamFailed, match="circuit is open") as refused:
        await ask(engine)
    assert len(upstream.bodies) == sent  # refused without being sent
    # Handed back: another worker of the model, else the route's next model.
    assert refused.value.retryable and refused.value.code == ErrorCode.MODEL_UNAVAILABLE
    assert refused.value.retry_after_s == 5.0  # until the probe
    assert not refused.value.restarts_engine

    await engine.probe_upstream_if_due()  # not due yet: nothing sent
    assert len(upstream.bodies) == sent
    clock.now_s += 5.0
    await engine.probe_upstream_if_due()  # due, upstream still refuses: open again, longer
    assert engine.upstream_degraded and breaker.seconds_to_probe() == 10.0
    upstream.status = 200
    clock.now_s += 10.0
    await engine.probe_upstream_if_due()
    assert not engine.upstream_degraded
    probe = upstream.bodies[-1]
    assert probe["max_tokens"] == 1 and probe["stream"] is False and "stream_options" not in probe
    assert await ask(engine) == "ok"
    await engine.stop()


@pytest.mark.parametrize("status", [400, 429, 503])
async def test_a_wrong_request_or_a_busy_upstream_does_not_count(status: int) -> None:
    upstream, clock = Upstream(), Clock()
    # A cooldown past the longest Retry-After waited for: busy is handed back at once.
    engine = await engine_on(upstream, clock, breaker=BreakerConfig(failure_threshold=1), busy_cooldown_s=3.0)
    upstream.status = status
    for i in range(3):
        with pytest.raises(RequestRejected if status == 400 else UpstreamBusy):
            await ask(engine, f"r{i}")
    assert not engine.upstream_degraded and engine.pool.deployments[0].breaker.consecutive_failures == 0
    await engine.stop()


async def test_models_probe_asks_get_models() -> None:
    upstream, clock = Upstream(), Clock()
    engine = await engine_on(upstream, clock, breaker=BreakerConfig(failure_threshold=1, probe="models"))
    upstream.status = 502
    with pytest.raises(UpstreamFailed):
        await ask(engine)
    upstream.status = 200
    clock.now_s += 30.0
    await engine.probe_upstream_if_due()
    assert upstream.paths[-1] == "/v1/models" and not engine.upstream_degraded
    await engine.stop()


# -- the scheduler with a degraded worker ------------------------------------------------------


def heartbeat(worker_id: str, state: WorkerState, model: str = "gpt-4.1") -> WorkerStatus:
    return WorkerStatus(
        worker_id=worker_id,
        node_id="n",
        state=state,
        engine="openai-http",
        models=[model],
        max_model_len=128_000,
        max_num_seqs=64,
    )


def test_scheduler_places_on_the_healthy_worker_and_falls_back_when_all_are_degraded() -> None:
    core = SchedulerCore(Pipeline.load("default"), CoreConfig(seed=0))
    fleet = {"h-bad": WorkerState.DEGRADED, "h-ok": WorkerState.READY}

    def beat(now_ms: int) -> None:
        for wid, state in fleet.items():
            core.on_heartbeat(heartbeat(wid, state), now_ms)
        core.on_heartbeat(heartbeat("mini", WorkerState.READY, model="gpt-4.1-mini"), now_ms)

    beat(1_000)
    core.tick(1_000)
    now_ms = 1_000 + core.config.heartbeat_timeout_ms + 1  # the fleet is known from here on
    beat(now_ms)
    for i in range(5):
        request = SchedRequest.from_routed(routed("gpt-4.1", ["gpt-4.1-mini"]), now_ms, 16, 64)
        [placed] = core.submit(request, now_ms)
        assert isinstance(placed, PlaceAction) and placed.placement.worker_id == "h-ok", i

    fleet["h-ok"] = WorkerState.DEGRADED
    beat(now_ms)
    [action] = core.submit(SchedRequest.from_routed(routed("gpt-4.1", ["gpt-4.1-mini"]), now_ms, 16, 64), now_ms)
    # Every gpt-4.1 worker degraded: model_unavailable at once, so the router's chain takes gpt-4.1-mini.
    assert isinstance(action, FinalError) and action.error.code == ErrorCode.MODEL_UNAVAILABLE
