"""A hosted primary that fails one way at a time, through the gateway with the official `openai` SDK:
`model: auto`, routed by the shipped policy to the primary hosted model (gpt-4.1-mini) whose chain falls
back to a healthy model (llama-3.3-70b-instruct). Real router, scheduler, gateway and two openai-http
workers on Kafka and Redis; each worker's upstream is a fake OpenAI server (llmbus_tools/harness), the
primary's injecting the fault (openai_faults.py), the fallback's answering with its own words.

For every fault, streamed and not: the client receives the whole answer within the fault's stated bound,
or an explicit error (a prompt that fits no model: 400 context_length_exceeded). Never a hang, never a
word missing or repeated: the primary writes ` w0 w1 ...`, the fallback ` f0 f1 ...`, each word naming
its place, so the answer is exactly 20 words numbered 0..19, from the primary up to where it broke off
and the fallback after (a fallback that starts afresh writes f0..f19). One result per request.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from llmbus.bus.admin import ensure_catalog
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_tools.harness.openai_faults import Fault
from llmbus_tools.harness.openai_server import FakeOpenAIServer
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.service_procs import ServiceProc, fresh_settings, wait_workers_ready
from tests.support import gateway_sentinel, module_stack, results_then_sentinel, wait_http_ok

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

PRIMARY, FALLBACK = "gpt-4.1-mini", "llama-3.3-70b-instruct"  # the shipped policy's default rule and its chain
TOKENS = 20
FIRST_TOKEN_S, STALL_S = 2.0, 1.0  # the primary's timeouts here (the defaults: 10 s and 5 s, OPENAI_HTTP.md)
FALLBACK_WINDOW = 32_768
HOP_S = 10.0  # a fallback over the bus (hand back, re-route, place, read back) on a loaded 2-core machine


@dataclass
class Stack:
    settings: BusSettings
    base_url: str
    key: str
    primary: FakeOpenAIServer
    fallback: FakeOpenAIServer


def upstreams(path: Path, primary: FakeOpenAIServer, fallback: FakeOpenAIServer) -> Path:
    common = {
        "api_key": "sk-upstream",
        "max_num_seqs": 16,
        "continuation": "continue_final_message",  # both answer as `vllm serve` does
        "breaker": {"failure_threshold": 1000},  # one fault at a time: none leaves the next one a degraded worker
    }
    entries = [
        common
        | {
            "model": PRIMARY,
            "base_url": primary.base_url,
            "max_model_len": 128_000,
            "first_token_timeout_s": FIRST_TOKEN_S,
            "stall_timeout_s": STALL_S,
        },
        common | {"model": FALLBACK, "base_url": fallback.base_url, "max_model_len": FALLBACK_WINDOW},
    ]
    path.write_text(yaml.safe_dump({"upstreams": entries}))
    return path


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory, kafka_up: None, redis_up: None) -> AsyncIterator[Stack]:
    settings = fresh_settings()
    await ensure_catalog(settings)
    redis = redis_client(settings.redis_url)
    key, _ = await ApiKeyStore(redis, gateway_key_namespace(settings.topic_prefix)).create("acme")
    primary, fallback = FakeOpenAIServer(), FakeOpenAIServer(word="f")
    await primary.start()
    await fallback.start()
    log_dir = tmp_path_factory.mktemp("hosted-faults")
    file = str(upstreams(log_dir / "upstreams.yaml", primary, fallback))
    port = free_port()

    def worker(worker_id: str, model: str) -> ServiceProc:
        env = {
            "LLMBUS_WORKER_WORKER_ID": worker_id,
            "LLMBUS_WORKER_ENGINE": "openai-http",
            "LLMBUS_WORKER_MODEL": model,
            "LLMBUS_WORKER_OPENAI_UPSTREAMS_FILE": file,
        }
        return ServiceProc("llmbus_services.engine_worker", settings, env, log_dir, worker_id).start()

    procs = [
        ServiceProc("llmbus_services.router", settings, {}, log_dir).start(),
        ServiceProc("llmbus_services.scheduler", settings, {}, log_dir).start(),
        worker("w-primary", PRIMARY),
        worker("w-fallback", FALLBACK),
        ServiceProc(
            "llmbus_services.gateway",
            settings,
            {"LLMBUS_GATEWAY_PORT": str(port), "LLMBUS_GATEWAY_INSTANCE_ID": "gw-faults"},
            log_dir,
        ).start(),
    ]
    base_url = f"http://127.0.0.1:{port}"
    try:
        async with module_stack(procs, settings):
            await wait_workers_ready(settings, {"w-primary", "w-fallback"}, timeout_s=240)
            await wait_http_ok(f"{base_url}/ready")
            yield Stack(settings, base_url, key, primary, fallback)
    finally:
        await primary.stop()
        await fallback.stop()
        await redis.aclose()


def numbered(words: list[str]) -> list[int]:
    return [int(word[1:]) for word in words]


@dataclass(frozen=True)
class Case:
    fault: Fault
    bound_s: float  # the whole answer within this (HOP_S where it goes to the fallback over the bus)
    answered_by: str  # "primary", "fallback", "both" (continued), or "error"
    primary_words: int = 0  # "both": the words the primary wrote before the fallback went on


CASES = {
    "429 short Retry-After, once": Case(Fault("status", 429, "1", times=1), 1 + 5, "primary"),
    "429 short Retry-After, always": Case(Fault("status", 429, "1"), 2 + HOP_S, "fallback"),
    "500": Case(Fault("status", 500), 0.25 + HOP_S, "fallback"),
    "503 once": Case(Fault("status", 503, times=1), 1 + 5, "primary"),
    "connection reset": Case(Fault("reset"), 0.25 + HOP_S, "fallback"),
    "stall before the first byte": Case(Fault("stall_first_byte"), FIRST_TOKEN_S + HOP_S, "fallback"),
    "empty 200": Case(Fault("empty_200"), 0.25 + HOP_S, "fallback"),
    # Stalled after 8 words: the fallback continues (a stalled upstream is not tried again). Cut after 8 words:
    # continued once on the same upstream (8 more), cut again: the fallback continues from the 16.
    "stall mid-answer": Case(Fault("stall_mid"), STALL_S + HOP_S, "both", 8),
    "cut mid-answer": Case(Fault("cut_mid"), HOP_S, "both", 16),
    "malformed SSE mid-answer": Case(Fault("malformed_mid"), HOP_S, "both", 16),
    "context_length_exceeded, the fallback's window fits": Case(
        Fault("context_length_exceeded", window=8_192), HOP_S, "fallback"
    ),
    "context_length_exceeded, no window fits": Case(
        Fault("context_length_exceeded", window=FALLBACK_WINDOW + 1_000), HOP_S, "error"
    ),
    # Last: the primary's worker then cools down for 30 s.
    "429 long Retry-After": Case(Fault("status", 429, "30"), HOP_S, "fallback"),
}


async def ask(stack: Stack, stream: bool, marker: str) -> tuple[str, str]:
    """The answer's text and request id; the SDK raises on an error answer or an SSE error event."""
    client = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.key, max_retries=0, timeout=120)
    messages: Any = [{"role": "user", "content": f"Say hi ({marker})"}]
    hints = {"complexity": 0.1}  # the default rule: gpt-4.1-mini, falling back to llama-3.3-70b-instruct
    if not stream:
        raw = await client.chat.completions.with_raw_response.create(
            model="auto", messages=messages, max_tokens=TOKENS, temperature=0.7, extra_body=hints
        )
        return raw.parse().choices[0].message.content or "", raw.headers["x-request-id"]
    async with client.chat.completions.with_streaming_response.create(
        model="auto", messages=messages, max_tokens=TOKENS, temperature=0.7, extra_body=hints, stream=True
    ) as opened:
        request_id = opened.headers["x-request-id"]
        text = "".join([c.choices[0].delta.content or "" async for c in await opened.parse() if c.choices])
    return text, request_id


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", list(CASES))
async def test_a_failing_primary_never_costs_the_client_its_answer(stack: Stack, name: str, stream: bool) -> None:
    case = CASES[name]
    stack.primary.faults = [copy.deepcopy(case.fault)]
    results = await TopicTail(stack.settings, t.Topics(stack.settings.topic_prefix).name(t.RESULTS)).start()
    started = time.monotonic()
    took_s = float("nan")
    try:
        if case.answered_by == "error":
            with pytest.raises(openai.BadRequestError) as refused:
                await ask(stack, stream, name)
            took_s = time.monotonic() - started
            assert refused.value.code == "context_length_exceeded"
            assert took_s < case.bound_s
            return
        text, request_id = await ask(stack, stream, name)
        took_s = time.monotonic() - started
        sentinel = lambda: gateway_sentinel(stack.base_url, stack.key, FALLBACK)  # noqa: E731
        found = await results_then_sentinel(stack.settings, {request_id}, results, sentinel)
    finally:
        stack.primary.faults = []
        await results.stop()
        print(f"\n{name} ({'streamed' if stream else 'whole'}): answered in {took_s:.2f} s")
    words = text.split()
    assert numbered(words) == list(range(TOKENS)), text  # nothing missing, nothing twice
    by = {w[0] for w in words}
    assert by == {"primary": {"w"}, "fallback": {"f"}, "both": {"w", "f"}}[case.answered_by], text
    [result] = found[request_id]  # exactly one result
    assert result.text == text and result.usage.completion_tokens == TOKENS
    if case.answered_by == "both":
        assert [w[0] for w in words] == ["w"] * case.primary_words + ["f"] * (TOKENS - case.primary_words)
        # Billed per leg: the primary's (read back from the reply topic by the fallback's worker), the fallback's.
        assert result.model == FALLBACK and result.legs is not None and len(result.legs) >= 2
        assert (result.legs[-1].model, result.legs[-1].completion_tokens) == (FALLBACK, TOKENS - case.primary_words)
        assert sum(leg.completion_tokens for leg in result.legs) == TOKENS
    assert took_s < case.bound_s, f"{name}: {took_s:.1f} s"
    if case.fault.kind == "status" and case.fault.status in (429, 503):
        await asyncio.sleep(1.5)  # the primary's worker cools down for its Retry-After: the next case starts clear
