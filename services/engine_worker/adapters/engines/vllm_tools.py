"""`tool_choice` "auto" and "required" on vLLM, answered the way vLLM's OpenAI server answers them.

With a tool-call parser configured (vLLM's `--tool-call-parser`, e.g. `hermes` for Qwen2.5's
`<tool_call>` format), the request goes through vLLM's own parser (vllm/parser, as
vllm/entrypoints/openai/chat_completion/serving.py drives it): `adjust_request` sets the structured
outputs the parser wants ("required": a structural tag that makes the model write at least one call
in its own format), and every engine step's delta is parsed by `parse_delta` into text and tool-call
fragments. "auto" leaves the model free: the parser finds the calls in what it writes.

Without a parser, "required" is vLLM's standard JSON path (vllm/tool_parsers/utils.py,
get_json_schema_from_tools): the answer is a JSON array of `{"name", "parameters"}` objects under
structured outputs, streamed as calls by vLLM's `extract_required_tool_call_streaming`; "auto" is
answered as text (no parser knows the model's call format).

A named tool_choice needs no parser: its arguments are decoded under the function's schema
(structured.py) and streamed as that call (forced_call_delta).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from llmbus.contract.messages import FunctionCallDelta, ToolCallDelta

# The tool_choice values a parser (or the JSON path) answers; None with tools means "auto" (OpenAI's default).
PARSED_CHOICES = ("auto", "required", None)


class ToolCallStream(Protocol):
    structured_outputs: Any  # vLLM's StructuredOutputsParams for the request, None: free text
    skip_special_tokens: bool

    def feed(
        self, delta_text: str, delta_token_ids: Sequence[int], prompt_token_ids: Sequence[int], finished: bool
    ) -> tuple[str, list[ToolCallDelta] | None]:
        """One engine step's output: (the text to stream, the tool-call fragments of this step)."""
        ...


def tool_call_stream(
    parser_name: str | None,
    tokenizer: Any,
    model: str,
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
) -> ToolCallStream | None:
    """The parsing a request's tools need, None where its answer is plain text (or a named call)."""
    if not tools or tool_choice not in PARSED_CHOICES:
        return None
    request = _chat_request(model, tools, tool_choice)
    if parser_name is not None:
        return ParsedToolCalls(parser_name, tokenizer, request)
    if tool_choice == "required":
        return RequiredJsonToolCalls(request)
    return None  # "auto" without a parser: the model's text is the answer


def check_parser(parser_name: str) -> None:
    """Raise KeyError naming the parsers vLLM has when `parser_name` is not one of them."""
    from vllm.tool_parsers import ToolParserManager

    ToolParserManager.get_tool_parser(parser_name)


def _chat_request(model: str, tools: list[dict[str, Any]], tool_choice: str | None) -> Any:
    """vLLM's own request object: its parsers and schema builders read tools and tool_choice off it.
    The messages are not needed here (the chat is rendered elsewhere) but the model requires one."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest.model_validate(
        {
            "model": model,
            "messages": [{"role": "user", "content": ""}],
            "tools": tools,
            "tool_choice": tool_choice or "auto",
        }
    )


def _ours(delta: Any) -> ToolCallDelta:
    function = delta.function
    return ToolCallDelta(
        index=delta.index,
        id=delta.id,
        type="function" if delta.id else None,
        function=None if function is None else FunctionCallDelta(name=function.name, arguments=function.arguments),
    )


class ParsedToolCalls:
    """vLLM's tool-call parser over one request's stream."""

    def __init__(self, parser_name: str, tokenizer: Any, request: Any) -> None:
        from vllm.parser import ParserManager

        parser_cls = ParserManager.get_parser(tool_parser_name=parser_name, enable_auto_tools=True)
        assert parser_cls is not None  # a tool parser name always composes a parser
        self._parser = parser_cls(tokenizer, request.tools)
        self._request = self._parser.adjust_request(request)
        self.structured_outputs = self._request.structured_outputs
        # Some models' call markers are special tokens: the parser must see them (hermes sets this False).
        self.skip_special_tokens = bool(self._request.skip_special_tokens)

    def feed(
        self, delta_text: str, delta_token_ids: Sequence[int], prompt_token_ids: Sequence[int], finished: bool
    ) -> tuple[str, list[ToolCallDelta] | None]:
        message = self._parser.parse_delta(
            delta_text, list(delta_token_ids), self._request, list(prompt_token_ids), finished=finished
        )
        if message is None:
            return "", None
        return message.content or "", [_ours(d) for d in message.tool_calls] or None


@dataclass
class RequiredJsonToolCalls:
    """ "required" without a parser: a JSON array of calls under structured outputs, streamed as calls."""

    request: Any
    skip_special_tokens: bool = True
    structured_outputs: Any = field(init=False)
    _text: str = field(default="", init=False)

    def __post_init__(self) -> None:
        from vllm.sampling_params import StructuredOutputsParams
        from vllm.tool_parsers.utils import get_json_schema_from_tools

        schema = get_json_schema_from_tools(self.request.tool_choice, self.request.tools)
        self.structured_outputs = StructuredOutputsParams(json=schema)

    def feed(
        self, delta_text: str, delta_token_ids: Sequence[int], prompt_token_ids: Sequence[int], finished: bool
    ) -> tuple[str, list[ToolCallDelta] | None]:
        from vllm.tool_parsers.streaming import extract_required_tool_call_streaming

        previous, self._text = self._text, self._text + delta_text
        message, _ = extract_required_tool_call_streaming(
            previous_text=previous, current_text=self._text, tool_call_idx=None, tool_call_id_type="random"
        )
        if message is None:
            return "", None
        return "", [_ours(d) for d in message.tool_calls] or None


def finish_reason(engine_reason: str | None, called: bool) -> str | None:
    """OpenAI's: "tool_calls" when an answer that made calls ended by itself ("auto" or "required"; vLLM's
    server does the same), the engine's reason otherwise (a named call ends with "stop")."""
    return "tool_calls" if called and engine_reason == "stop" else engine_reason


def forced_call_delta(
    request_id: str, forced_tool: dict[str, Any] | None, text: str, first: bool
) -> list[ToolCallDelta] | None:
    """A forced tool's call fragment: the generated text is its arguments (id, type, name first)."""
    if forced_tool is None or not (text or first):
        return None
    function = FunctionCallDelta(name=forced_tool["name"] if first else None, arguments=text)
    if first:
        return [ToolCallDelta(index=0, id=f"call_{request_id[:24]}", type="function", function=function)]
    return [ToolCallDelta(index=0, function=function)]
