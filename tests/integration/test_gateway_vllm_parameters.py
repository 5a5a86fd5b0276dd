"""OpenAI's parameters through the gateway (official `openai` SDK), router, scheduler and an engine-worker
to the real vLLM CPU engine (the tiny random-weight Llama with Granite 3.0's chat template, a 512-token
window): what reaches vLLM is the SamplingParams `vllm serve` would make of the same body, and what
comes back (several choices, log-probabilities) is OpenAI's shape.

And the window as the engine counts it: a chat whose tool definitions fit by the plain count, but not once
the chat template writes them out, ends in one final `prompt_too_long` with the engine's count, after
one attempt (the engine's admission refusal used to be a retryable over_capacity ending max_attempts).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from llmbus.bus import decode
from llmbus.client import TopicTail, collect_results
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    ChatMessage,
    DispatchOutcome,
    ErrorCode,
    InferenceRequest,
    OutcomeStatus,
    tools_text,
)
from llmbus.contract.request_key import request_key
from llmbus_services.engine_worker.adapters.engines import vllm_inputs
from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
from tests.fixtures.vllm_gateway import TENANT, VllmGateway, vllm_gateway
from tests.fixtures.vllm_prompts import hf_tokenizer, template_ids

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.redis,
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.asyncio(loop_scope="session"),
]

ASK: Any = [{"role": "user", "content": "which broker holds the partition?"}]


class SamplingSpy:
    """Wraps AsyncLLM.generate and keeps the SamplingParams of each request id."""

    def __init__(self, engine: VllmEngine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.params: dict[str, Any] = {}
        llm = engine._llm
        real = llm.generate

        async def generate(prompt: Any, params: Any, request_id: str, **kw: Any) -> AsyncIterator[Any]:
            self.params[request_id] = params
            async for out in real(prompt, params, request_id, **kw):
                yield out

        monkeypatch.setattr(llm, "generate", generate)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def gateway(vllm_engine: VllmEngine, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VllmGateway]:
    async with vllm_gateway(vllm_engine, Path(tmp_path_factory.mktemp("logs")), "vllm-gw-params") as stack:
        yield stack


async def test_unset_sampling_parameters_take_the_models_generation_config(
    gateway: VllmGateway, vllm_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine read its model's generation config at start, as `vllm serve` does ...
    assert vllm_engine._model_defaults == vllm_engine._llm.model_config.get_diff_sampling_param()
    # ... and a model whose generation_config.json sets these (as Qwen2.5-Instruct's does) gets them.
    monkeypatch.setattr(vllm_engine, "_model_defaults", {"temperature": 0.7, "top_p": 0.8, "top_k": 20})
    spy = SamplingSpy(vllm_engine, monkeypatch)
    raw = await gateway.sdk().chat.completions.with_raw_response.create(model=gateway.model, messages=ASK, max_tokens=3)
    params = spy.params[request_key(TENANT, raw.headers["x-request-id"])]
    assert (params.temperature, params.top_p, params.top_k) == (0.7, 0.8, 20)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty, params.min_p) == (
        0.0,
        0.0,
        1.0,
        0.0,
    )  # vLLM's neutral values where neither the request nor the model says
    # What the request sets wins over the model's defaults.
    raw = await gateway.sdk().chat.completions.with_raw_response.create(
        model=gateway.model, messages=ASK, max_tokens=3, temperature=0.2, extra_body={"top_k": 4}
    )
    params = spy.params[request_key(TENANT, raw.headers["x-request-id"])]
    assert (params.temperature, params.top_p, params.top_k) == (0.2, 0.8, 4)


async def test_every_sampling_parameter_reaches_vllm_and_choices_with_logprobs_come_back(
    gateway: VllmGateway, vllm_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = SamplingSpy(vllm_engine, monkeypatch)
    raw = await gateway.sdk().chat.completions.with_raw_response.create(
        model=gateway.model,
        messages=ASK,
        max_completion_tokens=4,
        n=2,
        logprobs=True,
        top_logprobs=2,
        seed=3,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        logit_bias={"7": 2.0},
        extra_body={"top_k": 10, "min_p": 0.05, "repetition_penalty": 1.2},
    )
    params = spy.params[request_key(TENANT, raw.headers["x-request-id"])]
    assert (params.n, params.logprobs, params.seed, params.max_tokens) == (2, 2, 3, 4)
    assert (params.presence_penalty, params.frequency_penalty, params.logit_bias) == (0.5, 0.25, {7: 2.0})
    assert (params.top_k, params.min_p, params.repetition_penalty) == (10, 0.05, 1.2)
    completion = raw.parse()
    assert sorted(c.index for c in completion.choices) == [0, 1]
    for choice in completion.choices:
        assert choice.finish_reason == "length" and choice.logprobs is not None
        entries = choice.logprobs.content or []
        assert len(entries) == 4 and all(len(entry.top_logprobs) == 2 for entry in entries)
        assert all(entry.logprob <= 0 for entry in entries)
    assert completion.usage is not None and completion.usage.completion_tokens == 8  # both choices


async def test_streamed_choices_each_end_with_their_finish_reason(gateway: VllmGateway) -> None:
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    stream = await gateway.sdk().chat.completions.create(
        model=gateway.model, messages=ASK, max_tokens=3, n=2, temperature=0.8, seed=1, stream=True
    )
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert finishes == {0: "length", 1: "length"} and all(texts.values())


async def test_developer_reaches_a_template_without_that_role_as_system_and_reasoning_effort_reaches_it(
    gateway: VllmGateway, vllm_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fixtures.vllm_prompts import PromptSpy

    efforts: list[str | None] = []
    real_render = vllm_inputs.render_chat

    async def render(*args: Any, **kwargs: Any) -> Any:
        efforts.append(kwargs.get("reasoning_effort"))
        return await real_render(*args, **kwargs)

    monkeypatch.setattr(vllm_inputs, "render_chat", render)
    prompts = PromptSpy(vllm_engine, monkeypatch)
    raw = await gateway.sdk().chat.completions.with_raw_response.create(
        model=gateway.model,
        messages=[{"role": "developer", "content": "answer in one word"}, *ASK],
        max_tokens=2,
        reasoning_effort="low",
    )
    as_system = [ChatMessage(role="system", content="answer in one word"), ChatMessage.model_validate(ASK[0])]
    assert prompts.prompt_ids[request_key(TENANT, raw.headers["x-request-id"])] == template_ids(vllm_engine, as_system)
    assert efforts == ["low"]


async def test_an_image_is_a_400_for_the_text_only_engine(gateway: VllmGateway) -> None:
    import openai

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    with pytest.raises(openai.BadRequestError) as refused:
        await gateway.sdk().chat.completions.create(
            model=gateway.model, messages=[{"role": "user", "content": [image]}], max_tokens=2
        )
    assert refused.value.param == "image_url"


async def test_an_unset_max_tokens_takes_what_the_engines_window_leaves(
    gateway: VllmGateway, vllm_engine: VllmEngine
) -> None:
    completion = await gateway.sdk().chat.completions.create(model=gateway.model, messages=ASK)
    assert completion.usage is not None  # the router's unknown-model defaults say 4,096; the engine has 512
    assert completion.usage.prompt_tokens + completion.usage.completion_tokens == vllm_engine.max_model_len


def _tools(count: int) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"lookup_offset_{i}",
                "description": "the committed offset of a partition",
                "parameters": {"type": "object", "properties": {"partition": {"type": "integer"}}},
            },
        }
        for i in range(count)
    ]


async def test_tools_that_overflow_the_window_once_templated_end_prompt_too_long_after_one_attempt(
    gateway: VllmGateway, vllm_engine: VllmEngine
) -> None:
    import openai

    max_tokens = 8
    tokenizer = hf_tokenizer(vllm_engine.config.model_path)
    messages = [ChatMessage.model_validate(m) for m in ASK]
    plain = InferenceRequest(messages=messages).prompt_text()
    budget = vllm_engine.max_model_len - max_tokens
    # As many tools as keep the plain count (the turns and the tools' JSON, what the worker counts before
    # the engine renders) within the window; the template, writing them out indented, goes over it.
    count = max(
        n for n in range(1, 20) if len(tokenizer.encode(plain)) + len(tokenizer.encode(tools_text(_tools(n)))) <= budget
    )
    tools = _tools(count)
    templated = len(template_ids(vllm_engine, messages, tools=tools))
    assert templated > budget, f"the template writes {templated} tokens: no overflow to show"

    topics = t.Topics(gateway.settings.topic_prefix)
    outcomes = await TopicTail(gateway.settings, topics.name(t.OUTCOMES)).start()
    results = await TopicTail(gateway.settings, topics.name(t.RESULTS)).start()
    try:
        with pytest.raises(openai.BadRequestError) as refused:
            await gateway.sdk().chat.completions.with_raw_response.create(
                model=gateway.model,
                messages=ASK,
                tools=tools,
                max_tokens=max_tokens,  # type: ignore[arg-type]
            )
        assert refused.value.code == "context_length_exceeded"
        assert str(templated) in refused.value.message, "the refusal says the engine's count"
        request_id = refused.value.response.headers["x-request-id"]
        found = await collect_results(gateway.settings, {request_id}, 30, results)
        [result] = found[request_id]
        assert result.error is not None and result.error.code == ErrorCode.PROMPT_TOO_LONG
        assert result.produced_by == "scheduler" and result.attempt == 1
        attempts = [
            outcome
            async for record in outcomes.records(timeout_s=3)
            if isinstance(outcome := decode(record, DispatchOutcome), DispatchOutcome)
            and outcome.request_id == request_id
        ]
    finally:
        await outcomes.stop()
        await results.stop()
    assert [(o.attempt, o.status, o.prompt_tokens) for o in attempts] == [(1, OutcomeStatus.RETRYABLE, templated)]
