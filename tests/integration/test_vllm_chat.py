"""The vLLM engine renders a chat with the model's own chat template (two families), a prompt raw.

The token ids are taken from vLLM's RequestOutput (what the engine core generated from) and
compared with Hugging Face's `apply_chat_template` on the same tokenizer files: the engine must
give an instruct model exactly what the model was trained on.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from llmbus.contract.messages import ChatMessage, ErrorCode, InferenceRequest
from llmbus.contract.tool_calls import assemble_tool_calls
from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
from llmbus_services.engine_worker.core.engine import EngineError, EngineOutput, EngineRequest, RequestRejected
from tests.fixtures.vllm_prompts import CHAT, LOOKUP_TOOL, PromptSpy, hf_tokenizer, template_ids

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]


async def _run(engine: VllmEngine, request: EngineRequest) -> list[EngineOutput]:
    return [o async for o in engine.generate(request)]


def _chat_request(request_id: str, messages: list[ChatMessage], max_tokens: int = 6) -> EngineRequest:
    text = InferenceRequest(messages=messages).prompt_text()  # what the worker puts in `prompt` for a chat
    return EngineRequest(request_id, text, max_tokens=max_tokens, temperature=0.0, messages=tuple(messages))


async def test_granite_chat_with_a_system_prompt_reaches_vllm_as_the_template_tokens(
    vllm_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = PromptSpy(vllm_engine, monkeypatch)
    outs = await _run(vllm_engine, _chat_request("chat-granite", CHAT))

    expected = template_ids(vllm_engine, CHAT)
    tokenizer = hf_tokenizer(vllm_engine.config.model_path)
    assert str(tokenizer.decode(expected)).startswith("<|start_of_role|>system<|end_of_role|>")
    assert spy.prompt_ids["chat-granite"] == expected
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
    spy = PromptSpy(vllm_chatml_engine, monkeypatch)
    outs = await _run(vllm_chatml_engine, _chat_request("chat-chatml", messages))

    expected = template_ids(vllm_chatml_engine, messages)
    text = str(hf_tokenizer(vllm_chatml_engine.config.model_path).decode(expected))
    assert text.startswith("<|im_start|>system\nYou answer in one word")  # the client's system prompt, not Qwen's
    assert '<|im_start|>user\n<tool_response>\n{"offset": 42}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n")
    assert spy.prompt_ids["chat-chatml"] == expected
    assert outs[-1].prompt_tokens == len(expected)


async def test_a_prompt_request_is_tokenized_raw(vllm_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = PromptSpy(vllm_engine, monkeypatch)
    prompt = "<|user|>\nthe kafka broker"  # looks like a chat, is a completion prompt: no template
    await _run(vllm_engine, EngineRequest("raw-1", prompt, max_tokens=2, temperature=0.0))

    tokenizer = hf_tokenizer(vllm_engine.config.model_path)
    assert spy.prompt_ids["raw-1"] == tokenizer.encode(prompt)


async def test_a_chat_too_long_for_the_model_is_refused_before_vllm(vllm_engine: VllmEngine) -> None:
    long_chat = [ChatMessage(role="user", content="the kafka broker " * 400)]
    with pytest.raises(EngineError) as refused:
        await _run(vllm_engine, _chat_request("chat-long", long_chat))
    assert refused.value.code in (ErrorCode.OVER_CAPACITY, ErrorCode.PROMPT_TOO_LONG)  # not a vLLM error


ASK = [ChatMessage(role="user", content="so?")]


async def test_tools_reach_the_chat_template_and_a_named_tool_choice_answers_that_call(
    vllm_chatml_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = PromptSpy(vllm_chatml_engine, monkeypatch)
    chat = _chat_request("chat-tools", ASK, max_tokens=40)
    forced = {"type": "function", "function": {"name": "lookup_offset"}}
    request = dataclasses.replace(chat, tools=[LOOKUP_TOOL], tool_choice=forced)
    outs = await _run(vllm_chatml_engine, request)

    tokenizer = hf_tokenizer(vllm_chatml_engine.config.model_path)
    expected = template_ids(vllm_chatml_engine, ASK, tools=[LOOKUP_TOOL])
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


def _tool_request(request_id: str, tool_choice: str, max_tokens: int, tools: list | None = None) -> EngineRequest:
    chat = _chat_request(request_id, ASK, max_tokens=max_tokens)
    return dataclasses.replace(chat, tools=tools or [LOOKUP_TOOL], tool_choice=tool_choice)


async def test_required_makes_the_model_write_a_call_in_its_own_format(
    vllm_chatml_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen's engine has vLLM's hermes parser: "required" is a structural tag (at least one
    <tool_call>{"name": ..., "arguments": ...}</tool_call>), parsed back into calls by the parser."""
    spy = PromptSpy(vllm_chatml_engine, monkeypatch)
    prompt_tokens = len(template_ids(vllm_chatml_engine, ASK, tools=[LOOKUP_TOOL]))
    window = vllm_chatml_engine.max_model_len - prompt_tokens  # all the tiny engine leaves after the tools
    outs = await _run(vllm_chatml_engine, _tool_request("chat-required", "required", window))

    assert len(spy.prompt_ids["chat-required"]) == prompt_tokens
    assert "".join(o.delta for o in outs) == ""  # the answer is calls, no text
    calls = assemble_tool_calls([d for o in outs for d in o.tool_calls or []])
    assert calls and {c.function.name for c in calls} == {"lookup_offset"}
    assert outs[-1].finish_reason in ("tool_calls", "length")  # random weights may not close the arguments


async def test_auto_answers_free_text_as_text(vllm_chatml_engine: VllmEngine) -> None:
    """tool_choice "auto" constrains nothing: the random model writes no <tool_call>, so its text is the answer."""
    outs = await _run(vllm_chatml_engine, _tool_request("chat-auto", "auto", 8))
    text = "".join(o.delta for o in outs)
    assert text and "<tool_call>" not in text
    assert not any(o.tool_calls for o in outs) and outs[-1].finish_reason == "length"
