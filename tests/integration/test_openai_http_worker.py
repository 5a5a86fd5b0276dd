"""Hosted upstreams behind real openai-http workers on the real stack (router, scheduler, gateway,
Kafka, Redis), driven by the official `openai` SDK.

Each worker's upstream is an OpenAI-compatible HTTP server run by the test
(llmbus_tools/harness/openai_server.py): it records every request exactly as it arrives and streams a
real OpenAI-format SSE answer. Checked: a multi-turn chat with a system prompt reaches the upstream
as the very message list the client sent, streaming and not; an upstream that answers 500 opens its
worker's circuit breaker (DEGRADED in the heartbeat), no request is lost meanwhile, new requests go
to the healthy worker, and once the upstream recovers the worker's probe makes it READY again.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import yaml

from llmbus.bus import decode
from llmbus.bus.admin import ensure_catalog
from llmbus.client import TopicTail, collect_results
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceResult, WorkerState, WorkerStatus
from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_tools.harness.openai_server import FakeOpenAIServer, SeenRequest
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.service_procs import ServiceProc, drop_namespace, fresh_settings, wait_workers_ready
from tests.support import wait_http_ok

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

MODEL = "gpt-4.1"  # named by the request: the default policy's `explicit` rule routes it as asked
WORKERS = ("hosted-a", "hosted-b")


@dataclass
class HostedStack:
    settings: BusSettings
    base_url: str
    key: str
    upstreams: dict[str, FakeOpenAIServer]  # worker id → its upstream
    procs: dict[str, ServiceProc]


def upstreams_file(path: Path, base_url: str) -> Path:
    entry = {
        "model": MODEL,
        "base_url": base_url,
        "api_key": "sk-upstream",
        "max_model_len": 128000,
        "max_num_seqs": 32,
        # Opens after 2 failures in a row; probes after 0.5 s, at most 1 s apart while it fails.
        "breaker": {"failure_threshold": 2, "cooldown_s": 0.5, "max_cooldown_s": 1.0},
    }
    path.write_text(yaml.safe_dump({"upstreams": [entry]}))
    return path


@pytest.fixture(scope="module")
async def hosted(
    tmp_path_factory: pytest.TempPathFactory, kafka_up: None, redis_up: None
) -> AsyncIterator[HostedStack]:
    settings = fresh_settings()
    await ensure_catalog(settings)
    redis = redis_client(settings.redis_url)
    key, _ = await ApiKeyStore(redis, gateway_key_namespace(settings.topic_prefix)).create("acme")
    upstreams = {w: FakeOpenAIServer() for w in WORKERS}
    for upstream in upstreams.values():
        await upstream.start()
    log_dir = tmp_path_factory.mktemp("hosted-logs")
    port = free_port()
    procs = [
        ServiceProc("llmbus_services.router", settings, {}, log_dir).start(),
        ServiceProc(
            "llmbus_services.scheduler", settings, {"LLMBUS_SCHEDULER_NO_WORKER_TIMEOUT_S": "3"}, log_dir
        ).start(),
        *(
            ServiceProc(
                "llmbus_services.engine_worker",
                settings,
                {
                    "LLMBUS_WORKER_WORKER_ID": w,
                    "LLMBUS_WORKER_ENGINE": "openai-http",
                    "LLMBUS_WORKER_MODEL": MODEL,
                    "LLMBUS_WORKER_OPENAI_UPSTREAMS_FILE": str(
                        upstreams_file(log_dir / f"{w}.yaml", upstreams[w].base_url)
                    ),
                },
                log_dir,
                w,
            ).start()
            for w in WORKERS
        ),
        ServiceProc(
            "llmbus_services.gateway",
            settings,
            {"LLMBUS_GATEWAY_PORT": str(port), "LLMBUS_GATEWAY_INSTANCE_ID": "gw-hosted"},
            log_dir,
        ).start(),
    ]
    base_url = f"http://127.0.0.1:{port}"
    try:
        await wait_workers_ready(settings, set(WORKERS), timeout_s=240)

        await wait_http_ok(f"{base_url}/ready")
        yield HostedStack(settings, base_url, key, upstreams, {p.name: p for p in procs})
    except BaseException:
        for proc in procs:
            print(f"\n--- log of {proc.name} ---\n{proc.log_tail()}")
        raise
    finally:
        for proc in procs:
            proc.kill()
        for upstream in upstreams.values():
            await upstream.stop()
        await redis.aclose()
        await drop_namespace(settings)


def sdk(stack: HostedStack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.key, max_retries=0, timeout=120)


def client_requests(upstream: FakeOpenAIServer) -> list[SeenRequest]:
    """What reached the upstream from clients (not the breaker's 1-token probes)."""
    return [s for s in upstream.seen if s.body.get("stream")]


def conversation(marker: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a terse assistant. Answer in French."},
        {"role": "user", "content": "What is Kafka?"},
        {"role": "assistant", "content": "Un journal distribué."},
        {"role": "user", "content": f"And a consumer group? ({marker})"},
    ]


def arrived_with(stack: HostedStack, marker: str) -> list[SeenRequest]:
    return [
        s
        for upstream in stack.upstreams.values()
        for s in client_requests(upstream)
        if marker in str(s.body.get("messages"))
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_multi_turn_chat_with_a_system_prompt_reaches_the_upstream_as_sent(
    hosted: HostedStack, stream: bool
) -> None:
    marker = uuid.uuid4().hex
    messages = conversation(marker)
    client = sdk(hosted)
    if stream:
        chunks = [
            c
            async for c in await client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=6,
                stream=True,  # type: ignore[arg-type]
            )
        ]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        done = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6)  # type: ignore[arg-type]
        text = done.choices[0].message.content or ""
    assert text == "".join(f" w{i}" for i in range(6))  # the upstream's answer, streamed through

    [seen] = arrived_with(hosted, marker)
    assert seen.path == "/v1/chat/completions"
    assert seen.body["messages"] == messages  # roles, order and contents: exactly the client's list
    assert seen.body["model"] == MODEL and seen.body["max_tokens"] == 6
    assert seen.headers["authorization"] == "Bearer sk-upstream"


async def ask(stack: HostedStack, marker: str) -> str:
    """One chat through the gateway; returns its request id (the SDK raises on any error answer)."""
    raw = await sdk(stack).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": f"Say something new ({marker})"}], max_tokens=4
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == " w0 w1 w2 w3"
    return raw.headers["x-request-id"]


async def wait_state(settings: BusSettings, worker_id: str, state: WorkerState, timeout_s: float) -> None:
    tail = await TopicTail(settings, t.Topics(settings.topic_prefix).name(t.WORKERS)).start()
    try:
        async for record in tail.records(timeout_s):
            status = decode(record, WorkerStatus)  # type: ignore[arg-type]
            if status.worker_id == worker_id and status.state == state:
                return
    finally:
        await tail.stop()
    raise TimeoutError(f"{worker_id} did not report {state} within {timeout_s} s")


async def results_of(stack: HostedStack, tail: TopicTail, request_ids: list[str]) -> list[InferenceResult]:
    found = await collect_results(stack.settings, set(request_ids), timeout_s=5, tail=tail)
    assert set(found) == set(request_ids), "a request without its result"
    assert all(len(found[r]) == 1 for r in request_ids), "a request with two results"
    return [found[r][0] for r in request_ids]


async def test_failing_upstream_degrades_its_worker_and_recovery_brings_it_back(hosted: HostedStack) -> None:
    bad, good = WORKERS
    settings = hosted.settings
    results = await TopicTail(settings, t.Topics(settings.topic_prefix).name(t.RESULTS)).start()
    try:
        hosted.upstreams[bad].fail_status = 500
        degraded = asyncio.create_task(wait_state(settings, bad, WorkerState.DEGRADED, 90))
        # Until the breaker opens, the requests the scheduler puts on `bad` fail there and are placed
        # again on `good`: every one is answered, none twice.
        failing_phase: list[str] = []
        while not degraded.done() and len(failing_phase) < 60:
            failing_phase.append(await ask(hosted, f"failing {len(failing_phase)}"))
        await degraded
        answered = await results_of(hosted, results, failing_phase)
        assert {r.worker_id for r in answered} == {good}
        assert len(client_requests(hosted.upstreams[bad])) >= 2  # it did fail its share, twice in a row

        # Open: new requests are placed on the healthy worker straight away (first attempt), and the
        # failing upstream gets nothing but the breaker's probes.
        reached_bad = len(client_requests(hosted.upstreams[bad]))
        after = [await ask(hosted, f"open {i}") for i in range(6)]
        placed = await results_of(hosted, results, after)
        assert [(r.worker_id, r.attempt) for r in placed] == [(good, 1)] * 6
        assert len(client_requests(hosted.upstreams[bad])) == reached_bad
        probes = [s for s in hosted.upstreams[bad].seen if not s.body.get("stream")]
        assert probes and all(p.body["max_tokens"] == 1 for p in probes)

        # The upstream answers again: the next probe closes the breaker and `bad` takes requests again.
        hosted.upstreams[bad].fail_status = None
        await wait_state(settings, bad, WorkerState.READY, 30)
        recovered: list[str] = []
        while len(recovered) < 40:
            recovered.append(await ask(hosted, f"recovered {len(recovered)}"))
            if len(client_requests(hosted.upstreams[bad])) > reached_bad:
                break
        answered_again = await results_of(hosted, results, recovered)
        assert (bad, 1) in [(r.worker_id, r.attempt) for r in answered_again]
    finally:
        hosted.upstreams[bad].fail_status = None
        await results.stop()
