"""The OpenAI surface reaches every tier of the default policy (real Kafka, Redis and services, the
sim workers configured as `make up` configures them):
routing hints through extra body fields and `x-llmbus-*` headers, max_tokens from the model's cap,
response_format / tools passed to a hosted upstream and refused where the engine is the sim,
fill-in-the-middle `suffix`; and `llmbus chat` on the bus with the same hints and `auto`."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from llmbus.bus import decode
from llmbus.bus.admin import ensure_catalog
from llmbus.cli import stack as dev_stack
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceRequest, InferenceResult, RoutedRequest
from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_tools.harness.openai_server import FakeOpenAIServer
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.service_procs import REPO, ServiceProc, drop_namespace, fresh_settings, wait_workers_ready
from tests.support import eventually, gateway_sentinel, results_then_sentinel

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

SMALL, MID, DEFAULT, STRONG = "qwen2.5-coder-1.5b-instruct", "llama-3.3-70b-instruct", "gpt-4.1-mini", "gpt-4.1"
ASK: Any = [{"role": "user", "content": "fix this typo: teh"}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}


@dataclass
class Stack:
    settings: BusSettings
    base_url: str
    key: str
    upstream: FakeOpenAIServer


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory, kafka_up: None, redis_up: None) -> AsyncIterator[Stack]:
    """The default policy as shipped; sim workers for three tiers, the strong one hosted (a fake upstream)."""
    settings = fresh_settings()
    await ensure_catalog(settings)
    redis = redis_client(settings.redis_url)
    key, _ = await keys_store(redis, settings).create("acme")
    upstream = FakeOpenAIServer()
    await upstream.start()
    port = free_port()
    log_dir = tmp_path_factory.mktemp("logs")

    # The sim workers exactly as `make up` configures them (profile, window), but instant and
    # without the stack's fixed /metrics ports.
    fleet = {
        proc.env["LLMBUS_WORKER_MODEL"]: proc.env
        for proc in dev_stack.default_services(workers=0)
        if proc.module == "llmbus_services.engine_worker"
    }

    def worker(worker_id: str, model: str, **more: str) -> ServiceProc:
        env = fleet[model] | {"LLMBUS_WORKER_WORKER_ID": worker_id, "LLMBUS_WORKER_SIM_SPEEDUP": "0"}
        env["LLMBUS_METRICS_PORT"] = "0"
        return ServiceProc("llmbus_services.engine_worker", settings, env | more, log_dir, worker_id).start()

    procs = [
        ServiceProc("llmbus_services.router", settings, {}, log_dir).start(),
        ServiceProc(
            "llmbus_services.scheduler", settings, {"LLMBUS_SCHEDULER_NO_WORKER_TIMEOUT_S": "3"}, log_dir
        ).start(),
        worker("w-small", SMALL),
        worker("w-mid", MID),
        worker("w-default", DEFAULT),
        worker(
            "w-strong",
            STRONG,
            LLMBUS_WORKER_ENGINE="openai-http",
            LLMBUS_WORKER_OPENAI_BASE_URL=upstream.base_url,
            LLMBUS_WORKER_OPENAI_MODEL="det",
        ),
        ServiceProc(
            "llmbus_services.gateway",
            settings,
            {"LLMBUS_GATEWAY_PORT": str(port), "LLMBUS_GATEWAY_INSTANCE_ID": "gw-hints"},
            log_dir,
        ).start(),
    ]
    base_url = f"http://127.0.0.1:{port}"
    try:
        await wait_workers_ready(settings, {"w-small", "w-mid", "w-default", "w-strong"}, timeout_s=240)

        async def gateway_ready() -> bool:
            try:
                async with httpx.AsyncClient() as http:
                    return (await http.get(f"{base_url}/ready", timeout=2)).status_code == 200
            except httpx.HTTPError:
                return False

        await eventually(gateway_ready, timeout_s=90, interval_s=0.3)
        yield Stack(settings, base_url, key, upstream)
    except BaseException:
        for proc in procs:
            print(f"\n--- log of {proc.name} ---\n{proc.log_tail()}")
        raise
    finally:
        for proc in procs:
            proc.kill()
        await upstream.stop()
        await redis.aclose()
        await drop_namespace(settings)


def keys_store(redis: object, settings: BusSettings) -> ApiKeyStore:
    return ApiKeyStore(redis, gateway_key_namespace(settings.topic_prefix))  # type: ignore[arg-type]


def sdk(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.key, max_retries=0, timeout=120)


async def _chat_and_result(stack: Stack, **kwargs: object) -> tuple[object, InferenceResult]:
    results = await TopicTail(stack.settings, t.Topics(stack.settings.topic_prefix).name(t.RESULTS)).start()
    try:
        raw = await sdk(stack).chat.completions.with_raw_response.create(**kwargs)  # type: ignore[call-overload]
        request_id = raw.headers["x-request-id"]
        sentinel = lambda: gateway_sentinel(stack.base_url, stack.key, "auto")  # noqa: E731
        found = await results_then_sentinel(stack.settings, {request_id}, results, sentinel)
    finally:
        await results.stop()
    [result] = found[request_id]
    return raw.parse(), result


async def test_category_hint_reaches_the_editor_tier_by_body_or_header(stack: Stack) -> None:
    completion, result = await _chat_and_result(
        stack, model="auto", messages=ASK, max_tokens=8, extra_body={"category": "quick_edit"}
    )
    assert completion.model == SMALL and result.route_reason == "rule:editor_fast"  # type: ignore[attr-defined]
    completion, result = await _chat_and_result(
        stack, model="auto", messages=ASK, max_tokens=8, extra_headers={"x-llmbus-category": "tab_completion"}
    )
    assert completion.model == SMALL and result.route_reason == "rule:editor_fast"  # type: ignore[attr-defined]
    completion, result = await _chat_and_result(stack, model="auto", messages=ASK, max_tokens=8)
    assert completion.model == DEFAULT and result.route_reason == "default"  # type: ignore[attr-defined]


async def test_token_budget_session_and_priority_reach_the_request(stack: Stack) -> None:
    requests = await TopicTail(stack.settings, t.Topics(stack.settings.topic_prefix).name(t.REQUESTS)).start()
    try:
        completion, result = await _chat_and_result(
            stack,
            model="auto",
            messages=ASK,
            max_tokens=8,
            extra_headers={"x-llmbus-token-budget": "4000", "x-llmbus-session-id": "sess-7"},
            extra_body={"priority": 1},
        )
        seen: list[InferenceRequest] = []
        async for record in requests.records(timeout_s=5):
            request = decode(record, InferenceRequest)  # type: ignore[arg-type]
            if request.request_id == result.request_id:
                seen.append(request)
                break
    finally:
        await requests.stop()
    assert completion.model == MID and result.route_reason == "rule:token_budget_low"  # type: ignore[attr-defined]
    [request] = seen
    assert (request.token_budget, request.session_id, request.priority) == (4000, "sess-7", 1)
    with pytest.raises(openai.BadRequestError) as bad:
        await sdk(stack).chat.completions.create(
            model="auto", messages=ASK, max_tokens=8, extra_headers={"x-llmbus-priority": "urgent"}
        )
    assert bad.value.param == "x-llmbus-priority"


async def test_max_tokens_omitted_is_the_models_output_cap(stack: Stack) -> None:
    routed = await TopicTail(stack.settings, t.Topics(stack.settings.topic_prefix).name(t.ROUTED)).start()
    try:
        completion, result = await _chat_and_result(
            stack, model="auto", messages=ASK, extra_body={"category": "quick_edit"}
        )
        caps = [
            decode(record, RoutedRequest).request.max_tokens  # type: ignore[arg-type, attr-defined]
            async for record in routed.records(timeout_s=2)
            if decode(record, RoutedRequest).request_id == result.request_id  # type: ignore[arg-type, attr-defined]
        ]
    finally:
        await routed.stop()
    assert caps == [1024]  # the small model's max_output_tokens in the default policy, not 256
    # The answer ends on its own (the sim's natural length), within that cap: what a model does without max_tokens
    assert 0 < completion.usage.completion_tokens == result.usage.completion_tokens <= 1024  # type: ignore[attr-defined]
    assert completion.choices[0].finish_reason == ("stop" if completion.usage.completion_tokens < 1024 else "length")


async def test_response_format_and_tools_reach_the_hosted_upstream(stack: Stack) -> None:
    before = len(stack.upstream.seen)
    response_format = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}}
    completion, result = await _chat_and_result(
        stack,
        model=STRONG,
        messages=ASK,
        max_tokens=4,
        response_format=response_format,
        tools=[TOOL],
        tool_choice="auto",
    )
    [body] = [seen.body for seen in stack.upstream.seen[before:]]
    assert body["response_format"] == response_format
    assert body["tools"] == [TOOL] and body["tool_choice"] == "auto"
    assert completion.choices[0].message.content == result.text  # type: ignore[attr-defined]


async def test_response_format_refused_with_400_where_the_engine_is_the_sim(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as named:  # the gateway knows the model's engines
        await sdk(stack).chat.completions.create(
            model=SMALL, messages=ASK, max_tokens=4, response_format={"type": "json_object"}
        )
    assert named.value.param == "response_format" and "sim engine" in str(named.value.message)
    with pytest.raises(openai.BadRequestError) as routed:  # `auto`: the worker refuses, finally
        await sdk(stack).chat.completions.create(
            model="auto",
            messages=ASK,
            max_tokens=4,
            response_format={"type": "json_object"},
            extra_body={"category": "quick_edit"},
        )
    assert routed.value.code == "invalid_request" and "sim engine" in str(routed.value.message)


async def test_suffix_fill_in_the_middle_on_the_tab_completion_tier(stack: Stack) -> None:
    client = sdk(stack)
    hint = {"category": "tab_completion"}
    plain = await client.completions.create(model="auto", prompt="def add(a, b):\n", max_tokens=4, extra_body=hint)
    fim = await client.completions.create(
        model="auto", prompt="def add(a, b):\n", suffix="\n\nprint(add(1, 2))\n", max_tokens=4, extra_body=hint
    )
    assert fim.model == SMALL and fim.choices[0].text
    assert plain.usage is not None and fim.usage is not None
    assert fim.usage.prompt_tokens > plain.usage.prompt_tokens  # the suffix is prompt the engine read


def _cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {
        "LLMBUS_TOPIC_PREFIX": stack.settings.topic_prefix,
        "LLMBUS_KAFKA_BOOTSTRAP": stack.settings.kafka_bootstrap,
        "COLUMNS": "200",
    }
    return subprocess.run(
        [sys.executable, "-m", "llmbus.cli.main", "chat", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_cli_chat_auto_takes_the_hints_and_shows_errors(stack: Stack) -> None:
    ask = ("fix this typo", "--max-tokens", "8")
    fim = ("def add(a, b):\n", "--max-tokens", "4", "--category", "tab_completion", "--suffix", "\nprint(add(1, 2))\n")
    edit, budget, plain, infill = await asyncio.gather(
        asyncio.to_thread(_cli, stack, *ask, "--category", "quick_edit"),
        asyncio.to_thread(_cli, stack, *ask, "--token-budget", "900", "--session", "s-1"),
        asyncio.to_thread(_cli, stack, *ask),
        asyncio.to_thread(_cli, stack, *fim),
    )
    for done in (edit, budget, plain, infill):
        assert done.returncode == 0, done.stdout + done.stderr
    assert f"{SMALL} (rule:" in infill.stdout  # fill-in-the-middle on the tab-completion tier
    assert f"{SMALL} (rule:editor_fast) · usage" in edit.stdout
    assert f"{MID} (rule:token_budget_low) · usage" in budget.stdout
    assert f"{DEFAULT} (default) · usage" in plain.stdout  # `auto`, the default: the policy chose
    failed = await asyncio.to_thread(_cli, stack, "fix this typo", "--model", "nobody-serves-this")
    assert failed.returncode == 1
    assert "error model_unavailable: no live worker serves 'nobody-serves-this'" in failed.stdout.replace("\n", " ")
