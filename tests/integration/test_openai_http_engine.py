"""The openai-http engine against a real local HTTP server speaking the OpenAI streaming protocol."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from llmbus.contract.messages import ErrorCode
from llmbus_services.engine_worker.adapters.engines.openai_http import OpenAIHttpConfig, OpenAIHttpEngine
from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
from llmbus_services.engine_worker.core.engine import (
    AdmissionError,
    EngineDead,
    EngineOutput,
    EngineRequest,
    LegCut,
    RequestRejected,
    UpstreamBusy,
    UpstreamFailed,
)
from llmbus_tools.harness.openai_server import FakeOpenAIServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest_asyncio.fixture(loop_scope="session")
async def server() -> AsyncIterator[FakeOpenAIServer]:
    srv = FakeOpenAIServer()
    await srv.start()
    yield srv
    await srv.stop()


async def _engine(srv: FakeOpenAIServer, model: str = "det", **kw: object) -> OpenAIHttpEngine:
    engine = OpenAIHttpEngine(OpenAIHttpConfig(base_url=srv.base_url, model=model, **kw))  # type: ignore[arg-type]
    await engine.start()
    return engine


async def _collect(engine: OpenAIHttpEngine, request: EngineRequest) -> list[EngineOutput]:
    return [o async for o in engine.generate(request)]


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_streams_text_and_takes_usage_from_the_final_chunk(server: FakeOpenAIServer, api: str) -> None:
    engine = await _engine(server, api=api, api_key="sk-test", prompt_cache="salted")
    req = EngineRequest(
        "h-1",
        "one two three four five",
        max_tokens=10,
        seed=7,
        stop=("END",),
        trace_headers={"traceparent": TRACEPARENT, "x-internal": "no"},
        cache_salt="salt-of-acme",
    )
    outs = await _collect(engine, req)
    await engine.warmup()
    await engine.stop()

    assert "".join(o.delta for o in outs) == "".join(f" w{i}" for i in range(10))
    final = outs[-1]
    assert final.finished and final.finish_reason == "length"
    assert (final.prompt_tokens, final.completion_tokens, final.cached_prompt_tokens) == (5, 10, 3)  # server's usage
    assert [o.completion_tokens for o in outs[:-1]] == list(range(1, 11))
    seen = server.seen[-1]
    assert seen.path == ("/v1/chat/completions" if api == "chat" else "/v1/completions")
    assert seen.body["stream"] is True and seen.body["stream_options"] == {"include_usage": True}
    assert (seen.body["seed"], seen.body["stop"], seen.body["max_tokens"]) == (7, ["END"], 10)
    assert seen.body["cache_salt"] == "salt-of-acme"  # a salted upstream keys its prefix cache by it
    assert seen.headers["traceparent"] == TRACEPARENT and "x-internal" not in seen.headers
    assert seen.headers["x-request-id"] == "h-1"
    assert seen.headers["authorization"] == "Bearer sk-test"
    assert engine.stats().generation_tokens_total == 10


async def test_a_shared_upstream_cache_reports_no_cached_tokens_to_any_tenant(server: FakeOpenAIServer) -> None:
    """A hosted provider's prompt cache serves every tenant of the account: its cached_tokens would tell
    one tenant what another sent. The default (`prompt_cache: shared`) reports 0 and sends no salt; the
    worker's own statistics still count the upstream's hits."""
    engine = await _engine(server)
    outs = await _collect(engine, EngineRequest("h-shared", "one two three", max_tokens=4, cache_salt="salt-of-acme"))
    stats = engine.stats()
    await engine.stop()
    assert outs[-1].finished and outs[-1].cached_prompt_tokens == 0  # the upstream said 3
    assert "cache_salt" not in server.seen[-1].body
    assert stats.prefix_cache_hits_total == 3


async def test_abort_closes_the_stream(server: FakeOpenAIServer) -> None:
    server.chunk_delay_s = 0.05
    engine = await _engine(server)
    outs = []
    async for out in engine.generate(EngineRequest("h-abort", "hi", max_tokens=200)):
        outs.append(out)
        if len(outs) == 3:
            await engine.abort("h-abort")
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    assert outs[-1].completion_tokens < 200
    assert engine.stats().num_requests_running == 0
    for _ in range(50):  # the server notices the disconnect on its next chunk
        if "h-abort" in server.disconnected:
            break
        await asyncio.sleep(0.05)
    assert "h-abort" in server.disconnected
    await engine.stop()


@pytest.mark.parametrize(
    ("model", "error", "code"),
    [
        ("fail-500", UpstreamFailed, ErrorCode.MODEL_UNAVAILABLE),
        ("busy-429", UpstreamBusy, ErrorCode.OVER_CAPACITY),
        ("unavailable-503", UpstreamBusy, ErrorCode.OVER_CAPACITY),
        ("bad-400", RequestRejected, ErrorCode.INVALID_REQUEST),
        # Broken off after tokens went out: the leg ends, the answer is continued by the next one.
        ("truncate", LegCut, ErrorCode.MODEL_UNAVAILABLE),
        ("bad-json", LegCut, ErrorCode.MODEL_UNAVAILABLE),
    ],
)
async def test_upstream_failures_become_engine_errors(
    server: FakeOpenAIServer, model: str, error: type, code: ErrorCode
) -> None:
    engine = await _engine(server, model=model, busy_cooldown_s=3.0)  # past the 2 s waited for: handed back
    with pytest.raises(error) as info:
        await _collect(engine, EngineRequest(f"h-{model}", "hi", max_tokens=5))
    assert type(info.value) is error and info.value.code == code
    # One request's upstream error never means the engine is gone: no restart, no abort of the others.
    assert not info.value.restarts_engine
    assert info.value.retryable == (model != "bad-400")
    if model == "busy-429":
        assert info.value.retry_after_s == pytest.approx(7.0, abs=0.1)  # type: ignore[attr-defined]  # its Retry-After
    if model == "unavailable-503":
        assert info.value.retry_after_s == pytest.approx(3.0, abs=0.1)  # type: ignore[attr-defined]  # the cooldown
    assert engine.stats().num_requests_running == 0
    await engine.stop()


async def test_silence_longer_than_the_read_timeout_fails(server: FakeOpenAIServer) -> None:
    server.chunk_delay_s = 1.0
    engine = await _engine(server, stall_timeout_s=0.2)
    with pytest.raises(LegCut, match=r"no token for 0\.2 s"):
        await _collect(engine, EngineRequest("h-slow", "hi", max_tokens=3))
    await engine.stop()


async def test_admission_limits(server: FakeOpenAIServer) -> None:
    engine = await _engine(server, max_model_len=100, max_num_seqs=1)
    with pytest.raises(AdmissionError, match="max_model_len"):
        await _collect(engine, EngineRequest("h-long", "hi", max_tokens=100))
    server.chunk_delay_s = 0.05
    gen = engine.generate(EngineRequest("h-a", "hi", max_tokens=50))
    await gen.__anext__()
    with pytest.raises(AdmissionError, match="in flight"):
        await _collect(engine, EngineRequest("h-b", "hi", max_tokens=5))
    await gen.aclose()
    await engine.stop()


async def test_concurrent_streams_spread_over_small_pools_all_kept_alive(server: FakeOpenAIServer) -> None:
    """max_num_seqs streams at once over ceil(max_num_seqs / connections_per_pool) clients: none waits
    for a connection, the least busy client takes each new stream, and every connection is kept."""
    engine = await _engine(server, max_num_seqs=12, connections_per_pool=4, connect_timeout_s=1)
    deployment = engine.pool.deployments[0]
    assert len(deployment.clients) == 3
    server.chunk_delay_s = 0.05
    try:
        requests = [EngineRequest(f"pool-{i}", "one two", max_tokens=4) for i in range(12)]
        runs = [asyncio.create_task(_collect(engine, r)) for r in requests]
        await asyncio.sleep(0.1)
        assert deployment.streams_on == [4, 4, 4]  # spread evenly while they all stream
        outs = await asyncio.gather(*runs)
    finally:
        server.chunk_delay_s = 0.0
    assert all(out[-1].finish_reason for out in outs) and deployment.streams_on == [0, 0, 0]
    kept = [len(client._transport._pool.connections) for client in deployment.clients]  # type: ignore[attr-defined]
    assert kept == [4, 4, 4]  # idle and alive for the next requests, none closed
    await engine.stop()


async def test_unreachable_server_is_dead_at_warmup() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    engine = OpenAIHttpEngine(OpenAIHttpConfig(base_url=f"http://127.0.0.1:{port}/v1", model="x", connect_timeout_s=1))
    await engine.start()
    with pytest.raises(EngineDead):
        await engine.warmup()
    with pytest.raises(UpstreamFailed, match=r"circuit is open \(cannot reach"):  # opened at warm-up, not tried
        await _collect(engine, EngineRequest("h-x", "hi", max_tokens=2))
    await engine.stop()


@pytest.mark.vllm
@pytest.mark.slow
async def test_streams_the_real_tiny_vllm_engine_through_http(vllm_engine: VllmEngine) -> None:
    srv = FakeOpenAIServer(vllm_engine=vllm_engine)
    await srv.start()
    engine = await _engine(srv, model="tiny-vllm")
    prompt = "the scheduler places each routed request on one worker"
    via_http = await _collect(engine, EngineRequest("h-vllm", prompt, max_tokens=12, temperature=0.0))
    direct = [o async for o in vllm_engine.generate(EngineRequest("d-vllm", prompt, max_tokens=12, temperature=0.0))]
    await engine.stop()
    await srv.stop()

    assert "".join(o.delta for o in via_http) == "".join(o.delta for o in direct)
    assert via_http[-1].completion_tokens == 12 == direct[-1].completion_tokens
    assert via_http[-1].prompt_tokens == vllm_engine.count_tokens(prompt)
