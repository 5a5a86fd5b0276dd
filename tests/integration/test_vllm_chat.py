"""The vLLM engine renders a chat with the model's own chat template (two families), a prompt raw.

The token ids are taken from vLLM's RequestOutput (what the engine core generated from) and
compared with Hugging Face's `apply_chat_template` on the same tokenizer files: the engine must
give an instruct model exactly what the model was trained on.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from transformers import AutoTokenizer

from llmbus.contract.messages import ChatMessage, ErrorCode, InferenceRequest
from llmbus.contract.tool_calls import assemble_tool_calls
from services.engine_worker.adapters.engines.vllm_engine import VllmEngine
from services.engine_worker.core.engine import EngineError, EngineOutput, EngineRequest, RequestRejected

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

CHAT = [
    ChatMessage(role="system", content="You answer in one word about the kafka cluster."),
    ChatMessage(role="user", content="which broker holds the topic partition?"),
    ChatMessage(role="assistant", content="the broker with the partition offset."),
    ChatMessage(role="user", content="and the consumer?"),
]


def _template_ids(engine: VllmEngine, messages: list[ChatMessage]) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(engine.config.model_path)  # the files, not vLLM's wrapper
    conversation = [m.model_dump(exclude_none=True) for m in messages]
    return list(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_dict=False))


class _PromptSpy:
    """Wraps AsyncLLM.generate and keeps the prompt token ids vLLM reports for each request."""

    def __init__(self, engine: VllmEngine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.prompt_ids: dict[str, list[int]] = {}
        llm = engine._llm
        real = llm.generate

        async def generate(prompt: Any, params: Any, request_id: str, **kw: Any) -> AsyncIterator[Any]:
            async for out in real(prompt, params, request_id, **kw):
                self.prompt_ids[request_id] = list(out.prompt_token_ids)
                yield out

        monkeypatch.setattr(llm, "generate", generate)


async def _run(engine: VllmEngine, request: EngineRequest) -> list[EngineOutput]:
    return [o async for o in engine.generate(request)]


def _chat_request(request_id: str, messages: list[ChatMessage], max_tokens: int = 6) -> EngineRequest:
    text = InferenceRequest(messages=messages).prompt_text()  # what the worker puts in `prompt` for a chat
    return EngineRequest(request_id, text, max_tokens=max_tokens, temperature=0.0, messages=tuple(messages))


async def test_llama3_chat_with_a_system_prompt_reaches_vllm_as_the_template_tokens(
    vllm_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _PromptSpy(vllm_engine, monkeypatch)
    outs = await _run(vllm_engine, _chat_request("chat-llama3", CHAT))

    expected = _template_ids(vllm_engine, CHAT)
    tokenizer = AutoTokenizer.from_pretrained(vllm_engine.config.model_path)
    assert str(tokenizer.decode(expected)).startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")
    assert spy.prompt_ids["chat-llama3"] == expected
    assert outs[-1].prompt_tokens == len(expected) and outs[-1].completion_tokens == 6


async def test_chatml_chat_with_tool_turns_reaches_vllm_as_the_template_tokens(
    vllm_chatml_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = [
        *CHAT,
        ChatMessage(role="assistant", content="I look the offset up."),
        ChatMessage(role="tool", content='{"offset": 42}'),
        ChatMessage(role="user", content="so?"),
    ]
    spy = _PromptSpy(vllm_chatml_engine, monkeypatch)
    outs = await _run(vllm_chatml_engine, _chat_request("chat-chatml", messages))

    expected = _template_ids(vllm_chatml_engine, messages)
    text = str(AutoTokenizer.from_pretrained(vllm_chatml_engine.config.model_path).decode(expected))
    assert text.startswith("<|im_start|>system\nYou answer in one word")  # the client's system prompt, not Qwen's
    assert '<|im_start|>user\n<tool_response>\n{"offset": 42}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n")
    assert spy.prompt_ids["chat-chatml"] == expected
    assert outs[-1].prompt_tokens == len(expected)


async def test_a_prompt_request_is_tokenized_raw(vllm_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _PromptSpy(vllm_engine, monkeypatch)
    prompt = "<|user|>\nthe kafka broker"  # looks like a chat, is a completion prompt: no template
    await _run(vllm_engine, EngineRequest("raw-1", prompt, max_tokens=2, temperature=0.0))

    tokenizer = AutoTokenizer.from_pretrained(vllm_engine.config.model_path)
    assert spy.prompt_ids["raw-1"] == tokenizer.encode(prompt)


async def test_a_chat_too_long_for_the_model_is_refused_before_vllm(vllm_engine: VllmEngine) -> None:
    long_chat = [ChatMessage(role="user", content="the kafka broker " * 400)]
    with pytest.raises(EngineError) as refused:
        await _run(vllm_engine, _chat_request("chat-long", long_chat))
    assert refused.value.code in (ErrorCode.OVER_CAPACITY, ErrorCode.PROMPT_TOO_LONG)  # not a vLLM error


# Small: Qwen's tool preamble alone is ~450 tokens of this tiny tokenizer, the engine's window 512.
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_offset",
        "parameters": {"type": "object", "properties": {"partition": {"type": "integer"}}},
    },
}
ASK = [ChatMessage(role="user", content="so?")]


async def test_tools_reach_the_chat_template_and_a_named_tool_choice_answers_that_call(
    vllm_chatml_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _PromptSpy(vllm_chatml_engine, monkeypatch)
    chat = _chat_request("chat-tools", ASK, max_tokens=40)
    forced = {"type": "function", "function": {"name": "lookup_offset"}}
    request = dataclasses.replace(chat, tools=[LOOKUP_TOOL], tool_choice=forced)
    outs = await _run(vllm_chatml_engine, request)

    tokenizer = AutoTokenizer.from_pretrained(vllm_chatml_engine.config.model_path)
    conversation = [m.model_dump(exclude_none=True) for m in ASK]
    expected = list(
        tokenizer.apply_chat_template(conversation, tools=[LOOKUP_TOOL], add_generation_prompt=True, return_dict=False)
    )
    assert "lookup_offset" in str(tokenizer.decode(expected))  # Qwen's template lists the tools
    assert spy.prompt_ids["chat-tools"] == expected
    assert all(o.delta == "" for o in outs)  # the answer is the call, not text
    calls = assemble_tool_calls([d for o in outs for d in o.tool_calls or []])
    assert [c.function.name for c in calls] == ["lookup_offset"]
    # Random weights: only the grammar makes the arguments an object of the tool's parameters.
    # JSON allows any whitespace and random weights emit much of it, so 40 tokens (all the
    # 512-token window leaves) may end inside the object: judged as a prefix of one.
    arguments = calls[0].function.arguments
    assert arguments.lstrip().startswith("{"), arguments
    free = await _run(vllm_chatml_engine, dataclasses.replace(chat, request_id="chat-tools-free"))
    assert not "".join(o.delta for o in free).lstrip().startswith("{")  # without the grammar: no object
    if outs[-1].finish_reason == "stop":  # the object was finished
        value, _ = json.JSONDecoder().raw_decode(arguments.lstrip())
        assert isinstance(value, dict) and set(value) <= {"partition"}


async def test_a_tool_choice_naming_no_given_tool_is_refused(vllm_chatml_engine: VllmEngine) -> None:
    request = dataclasses.replace(
        _chat_request("chat-tools-bad", ASK),
        tools=[LOOKUP_TOOL],
        tool_choice={"type": "function", "function": {"name": "drop_topic"}},
    )
    with pytest.raises(RequestRejected, match="drop_topic"):
        await _run(vllm_chatml_engine, request)
