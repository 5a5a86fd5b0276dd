"""The official `openai` SDK through the gateway, router, scheduler and an engine-worker to the real vLLM
CPU engine: a multi-turn chat with a system prompt reaches the model as its chat template's tokens,
streaming and not; `tool_choice: "required"` on the Qwen engine (vLLM's hermes parser) answers calls;
`completions.create(suffix=...)` reaches the Qwen engine as its FIM format's tokens, and is a 400 for
the engine without one.

The prompt ids are those vLLM reports for the request (its RequestOutput), keyed by the worker's engine
request id (<tenant>:<request id>, the gateway's x-request-id), and compared with Hugging Face's
`apply_chat_template` on the model's tokenizer files.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from llmbus.contract.messages import ChatMessage, InferenceRequest
from llmbus.contract.request_key import request_key
from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
from tests.fixtures.vllm_gateway import TENANT, VllmGateway, vllm_gateway
from tests.fixtures.vllm_prompts import LOOKUP_TOOL, PromptSpy, hf_tokenizer, qwen_fim_ids, template_ids

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.redis,
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.asyncio(loop_scope="session"),
]

CHAT = [
    {"role": "system", "content": "You answer in one word about the kafka cluster."},
    {"role": "user", "content": "which broker holds the topic partition?"},
    {"role": "assistant", "content": "the broker with the partition offset."},
    {"role": "user", "content": "and the consumer?"},
]
ANSWER_TOKENS = 6  # exact: the session engine ignores EOS


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def gateway(vllm_engine: VllmEngine, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VllmGateway]:
    async with vllm_gateway(vllm_engine, Path(tmp_path_factory.mktemp("logs"))) as stack:
        yield stack


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def chatml_gateway(
    vllm_chatml_engine: VllmEngine, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[VllmGateway]:
    """The Qwen engine's own stack: its tests run in that engine's xdist group, beside its build."""
    async with vllm_gateway(vllm_chatml_engine, Path(tmp_path_factory.mktemp("logs")), "vllm-gw-chatml") as stack:
        yield stack


async def test_a_multi_turn_chat_with_a_system_prompt_reaches_vllm_as_its_chat_template_tokens(
    gateway: VllmGateway, vllm_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = template_ids(vllm_engine, [ChatMessage.model_validate(m) for m in CHAT])
    # The control: the plain-text rendering the engine once tokenized is another token sequence.
    tokenizer = hf_tokenizer(vllm_engine.config.model_path)
    plain = InferenceRequest(messages=[ChatMessage.model_validate(m) for m in CHAT]).prompt_text()
    assert tokenizer.encode(plain) != expected
    spy = PromptSpy(vllm_engine, monkeypatch)
    client = gateway.sdk()

    raw = await client.chat.completions.with_raw_response.create(
        model=gateway.model,
        messages=CHAT,
        max_tokens=ANSWER_TOKENS,
        temperature=0,  # type: ignore[arg-type]
    )
    completion = raw.parse()
    request_id = raw.headers["x-request-id"]
    assert spy.prompt_ids[request_key(TENANT, request_id)] == expected
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == len(expected) and completion.usage.completion_tokens == ANSWER_TOKENS
    answer = completion.choices[0].message.content
    assert answer

    # One token more: another answer-cache key (the same deterministic request would be answered from the
    # router's cache, never reaching the engine), the same greedy answer so far.
    raw_stream = await client.chat.completions.with_raw_response.create(
        model=gateway.model,
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=ANSWER_TOKENS + 1,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in raw_stream.parse()]
    streamed_id = raw_stream.headers["x-request-id"]
    assert streamed_id != request_id
    assert spy.prompt_ids[request_key(TENANT, streamed_id)] == expected, sorted(spy.prompt_ids)
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == len(expected) and usage.completion_tokens == ANSWER_TOKENS + 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith(answer)


async def test_tool_choice_required_answers_a_call_through_the_gateway(
    chatml_gateway: VllmGateway, vllm_chatml_engine: VllmEngine
) -> None:
    ask = [{"role": "user", "content": "so?"}]
    prompt_tokens = len(
        template_ids(vllm_chatml_engine, [ChatMessage.model_validate(m) for m in ask], tools=[LOOKUP_TOOL])
    )
    completion = await chatml_gateway.sdk().chat.completions.create(
        model=chatml_gateway.model,
        messages=ask,  # type: ignore[arg-type]
        tools=[LOOKUP_TOOL],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=vllm_chatml_engine.max_model_len - prompt_tokens,  # all the tiny window leaves
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.message.tool_calls, choice
    assert {c.function.name for c in choice.message.tool_calls} == {"lookup_offset"}  # type: ignore[union-attr]
    assert not choice.message.content
    assert choice.finish_reason in ("tool_calls", "length")  # random weights may not close the arguments
    assert completion.usage is not None and completion.usage.prompt_tokens == prompt_tokens


FIM_PREFIX, FIM_SUFFIX = "the broker holds the topic", " partition offset."


async def test_a_suffix_from_the_sdk_reaches_vllm_as_the_fim_formats_tokens(
    chatml_gateway: VllmGateway, vllm_chatml_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = qwen_fim_ids(vllm_chatml_engine, FIM_PREFIX, FIM_SUFFIX)
    spy = PromptSpy(vllm_chatml_engine, monkeypatch)
    raw = await chatml_gateway.sdk().completions.with_raw_response.create(
        model=chatml_gateway.model, prompt=FIM_PREFIX, suffix=FIM_SUFFIX, max_tokens=ANSWER_TOKENS, temperature=0
    )
    completion = raw.parse()
    assert spy.prompt_ids[request_key(TENANT, raw.headers["x-request-id"])] == expected
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == len(expected) and completion.usage.completion_tokens == ANSWER_TOKENS
    assert completion.choices[0].text


async def test_a_suffix_for_an_engine_without_a_fim_format_is_a_400(
    gateway: VllmGateway, monkeypatch: pytest.MonkeyPatch, vllm_engine: VllmEngine
) -> None:
    import openai  # imported here: collection stays free of the SDK

    spy = PromptSpy(vllm_engine, monkeypatch)
    with pytest.raises(openai.BadRequestError) as refused:
        await gateway.sdk().completions.create(
            model=gateway.model, prompt=FIM_PREFIX, suffix=FIM_SUFFIX, max_tokens=2, temperature=0
        )
    assert refused.value.status_code == 400 and refused.value.code == "unsupported_parameter"
    assert "suffix" in refused.value.message and "vllm" in refused.value.message
    assert not spy.prompt_ids  # refused at the gateway: nothing reached the engine
