"""tool_choice on the vLLM engine: which function a named choice forces, and how an answer becomes call
fragments: the generated text as the named call's arguments; for "auto" and "required", vLLM's own
parsers (hermes for Qwen's <tool_call> format, the JSON array without a parser) fed the way the engine
feeds them, one detokenized step at a time, with the tiny Qwen model's real tokenizer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from llmbus.contract.tool_calls import assemble_tool_calls
from llmbus_services.engine_worker.adapters.engines import vllm_tools
from llmbus_services.engine_worker.adapters.engines.structured import named_tool
from llmbus_services.engine_worker.adapters.engines.vllm_tools import forced_call_delta, tool_call_stream
from llmbus_tools.harness.tiny_llama import build_tiny_llama
from tests.fixtures.vllm_prompts import hf_tokenizer

LOOKUP_FUNCTION: dict[str, Any] = {"name": "lookup", "parameters": {"type": "object"}}
LOOKUP: dict[str, Any] = {"type": "function", "function": LOOKUP_FUNCTION}
DROP: dict[str, Any] = {"type": "function", "function": {"name": "drop"}}


def test_a_named_tool_choice_forces_that_function_and_the_others_do_not() -> None:
    forced = named_tool([DROP, LOOKUP], {"type": "function", "function": {"name": "lookup"}})
    assert forced == LOOKUP_FUNCTION
    for choice in (None, "auto", "none", "required"):
        assert named_tool([LOOKUP], choice) is None
    with pytest.raises(ValueError, match="'missing'"):
        named_tool([LOOKUP], {"type": "function", "function": {"name": "missing"}})


def test_the_generated_text_becomes_the_calls_arguments() -> None:
    function = LOOKUP_FUNCTION
    steps = [('{"par', True), ("", False), ('tition": 3}', False)]
    deltas = [d for text, first in steps for d in forced_call_delta("req-1", function, text, first) or []]
    (call,) = assemble_tool_calls(deltas)
    assert (call.id, call.function.name, call.function.arguments) == ("call_req-1", "lookup", '{"partition": 3}')
    assert forced_call_delta("req-1", None, "text", True) is None  # no forced tool: plain text


LOOKUP_OFFSET: dict[str, Any] = {
    "type": "function",
    "function": {"name": "lookup_offset", "parameters": {"type": "object", "properties": {"partition": {}}}},
}
CALL = '<tool_call>\n{"name": "lookup_offset", "arguments": {"partition": 7}}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen_tokenizer() -> Any:
    return hf_tokenizer(build_tiny_llama(chat_family="qwen2.5"))


def _answer(calls: vllm_tools.ToolCallStream, tokenizer: Any, text: str) -> tuple[str, list[Any]]:
    """What the engine streams for a model that wrote `text`: one token a step, as vLLM's DELTA outputs."""
    ids = tokenizer.encode(text)
    content, deltas = [], []
    for i, token in enumerate(ids):
        delta, tool_calls = calls.feed(tokenizer.decode([token]), [token], [0], i == len(ids) - 1)
        content.append(delta)
        deltas += tool_calls or []
    return "".join(content), assemble_tool_calls(deltas)


def test_auto_with_the_hermes_parser_finds_the_calls_in_the_text(qwen_tokenizer: Any) -> None:
    calls = tool_call_stream("hermes", qwen_tokenizer, "tiny-chatml", [LOOKUP_OFFSET], "auto")
    assert calls is not None and calls.structured_outputs is None  # auto: the model writes what it likes
    text, found = _answer(calls, qwen_tokenizer, f"the broker offset.{CALL}\n{CALL.replace('7', '8')}")
    assert text == "the broker offset."
    assert [(c.function.name, c.function.arguments) for c in found] == [
        ("lookup_offset", '{"partition": 7}'),
        ("lookup_offset", '{"partition": 8}'),
    ]
    assert len({c.id for c in found}) == 2
    assert vllm_tools.finish_reason("stop", called=True) == "tool_calls"


def test_auto_without_a_call_is_text_and_no_parser_means_text(qwen_tokenizer: Any) -> None:
    calls = tool_call_stream("hermes", qwen_tokenizer, "tiny-chatml", [LOOKUP_OFFSET], None)  # OpenAI's default
    assert calls is not None
    assert _answer(calls, qwen_tokenizer, "the broker keeps the offset.") == ("the broker keeps the offset.", [])
    assert vllm_tools.finish_reason("stop", called=False) == "stop"
    assert tool_call_stream(None, qwen_tokenizer, "tiny-chatml", [LOOKUP_OFFSET], "auto") is None
    assert tool_call_stream("hermes", qwen_tokenizer, "tiny-chatml", [LOOKUP_OFFSET], "none") is None
    assert tool_call_stream("hermes", qwen_tokenizer, "tiny-chatml", None, "auto") is None


def test_required_with_the_hermes_parser_is_a_structural_tag_of_at_least_one_call(qwen_tokenizer: Any) -> None:
    calls = tool_call_stream("hermes", qwen_tokenizer, "tiny-chatml", [LOOKUP_OFFSET], "required")
    assert calls is not None
    tag = json.loads(calls.structured_outputs.structural_tag)
    assert tag["format"]["at_least_one"] is True
    assert {t["begin"] for t in tag["format"]["tags"]} >= {'<tool_call>\n{"name": "lookup_offset", "arguments": '}
    assert _answer(calls, qwen_tokenizer, CALL)[1][0].function.arguments == '{"partition": 7}'


def test_required_without_a_parser_is_a_json_array_of_calls(qwen_tokenizer: Any) -> None:
    calls = tool_call_stream(None, qwen_tokenizer, "tiny-chatml", [LOOKUP_OFFSET], "required")
    assert calls is not None
    schema = calls.structured_outputs.json
    assert schema["type"] == "array" and schema["minItems"] == 1
    text, found = _answer(calls, qwen_tokenizer, '[{"name": "lookup_offset", "parameters": {"partition": 7}}]')
    assert text == "" and [(c.function.name, c.function.arguments) for c in found] == [
        ("lookup_offset", '{"partition": 7}')
    ]


def test_a_malformed_tool_or_an_unknown_parser_is_refused(qwen_tokenizer: Any) -> None:
    with pytest.raises(ValidationError):
        tool_call_stream("hermes", qwen_tokenizer, "tiny-chatml", [{"type": "function"}], "auto")
    with pytest.raises(KeyError):
        vllm_tools.check_parser("no-such-parser")
