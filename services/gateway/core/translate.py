"""OpenAI bodies -> InferenceRequest, and llmbus chunks -> OpenAI response objects (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmbus.contract.messages import ChatMessage, FinishReason, InferenceRequest, ToolCall, ToolCallDelta, Usage
from llmbus_services.gateway.core.openai_types import ChatCompletionBody, ChatMessageIn, CompletionBody

Kind = Literal["chat", "completion"]


def to_request(
    body: ChatCompletionBody | CompletionBody,
    *,
    request_id: str,
    tenant: str,
    reply_topic: str,
    auto_model: str,
    hints: dict[str, object] | None = None,
) -> InferenceRequest:
    """The bus request for an OpenAI body. The tenant comes from the API key, never from the body.

    `hints` are the routing hints (core/hints.py). A chat without max_tokens gets the model's
    output cap, bounded by the window the prompt leaves (the router sets it: it knows the model).
    Raises pydantic's ValidationError when the body asks for more than llmbus allows.
    """
    fields: dict[str, object] = (hints or {}) | {
        "request_id": request_id,
        "tenant": tenant,
        "reply_topic": reply_topic,
        "model": None if body.model == auto_model else body.model,  # `auto`: the router's policy picks
        "user_id": body.user,
        "stop": body.stops(),
        "seed": body.seed,
        "stream": body.stream,
        "metadata": body.metadata or {},
    }
    if body.temperature is not None:
        fields["temperature"] = body.temperature
    if body.top_p is not None:
        fields["top_p"] = body.top_p
    if isinstance(body, ChatCompletionBody):
        fields["messages"] = [_message(m) for m in body.messages]
        cap = body.output_cap_tokens()
        if body.response_format is not None:
            fields["response_format"] = body.response_format
        if body.tools:
            fields["tools"] = body.tools
            fields["tool_choice"] = body.tool_choice
    else:
        fields["prompt"] = body.prompt_text()
        fields["suffix"] = body.suffix
        cap = body.max_tokens  # OpenAI's default for completions is 16, not the model's cap
    if cap is not None:
        fields["max_tokens"] = cap
    else:
        fields["max_tokens_auto"] = True
    return InferenceRequest.model_validate(fields)


def _message(message: ChatMessageIn) -> ChatMessage:
    """A chat message for the bus: its text, and its name and tool-call fields where it has them."""
    return ChatMessage(
        role="system" if message.role == "developer" else message.role,
        content=message.text(),
        name=message.name,
        tool_calls=message.tool_calls,
        tool_call_id=message.tool_call_id,
    )


# OpenAI's finish reasons for llmbus's; every other one (an abort or error ends with an error event) is "stop".
_OPENAI_FINISH = {
    FinishReason.LENGTH: "length",
    FinishReason.TOOL_CALLS: "tool_calls",
    FinishReason.CONTENT_FILTER: "content_filter",
}


def finish_reason(reason: FinishReason | None) -> str:
    return _OPENAI_FINISH.get(reason, "stop") if reason is not None else "stop"


def usage_of(usage: Usage | None) -> dict[str, object]:
    usage = usage or Usage()
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
    }


@dataclass
class ResponseShape:
    """Builds the OpenAI objects of one response (chat.completion or text_completion)."""

    kind: Kind
    request_id: str
    created_s: int
    model: str

    @property
    def response_id(self) -> str:
        return f"{'chatcmpl' if self.kind == 'chat' else 'cmpl'}-{self.request_id}"

    def _head(self, obj: str) -> dict[str, object]:
        return {"id": self.response_id, "object": obj, "created": self.created_s, "model": self.model}

    def stream_chunk(
        self,
        delta: str,
        *,
        first: bool,
        finish: str | None,
        include_usage: bool,
        tool_calls: list[ToolCallDelta] | None = None,
    ) -> dict[str, object]:
        if self.kind == "chat":
            # OpenAI's deltas: a tool call fragment comes with `content` only where there is text.
            message: dict[str, object] = {"content": delta} if delta or not tool_calls else {}
            if first:
                message["role"] = "assistant"
                message.setdefault("content", None)
            if tool_calls:
                message["tool_calls"] = [call.model_dump(mode="json", exclude_none=True) for call in tool_calls]
            choice: dict[str, object] = {"index": 0, "delta": message, "logprobs": None, "finish_reason": finish}
            out = self._head("chat.completion.chunk") | {"choices": [choice]}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}
            out = self._head("text_completion") | {"choices": [choice]}
        if include_usage:
            out["usage"] = None  # OpenAI: null on every chunk but the last, usage-only one
        return out

    def usage_chunk(self, usage: Usage | None) -> dict[str, object]:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return self._head(obj) | {"choices": [], "usage": usage_of(usage)}

    def full(
        self, text: str, finish: str, usage: Usage | None, tool_calls: list[ToolCall] | None = None
    ) -> dict[str, object]:
        if self.kind == "chat":
            message: dict[str, object] = {"role": "assistant", "content": text, "refusal": None}
            if tool_calls:  # OpenAI: content null when the answer is only tool calls
                message["content"] = text or None
                message["tool_calls"] = [call.model_dump(mode="json") for call in tool_calls]
            choice: dict[str, object] = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
            }
            return self._head("chat.completion") | {"choices": [choice], "usage": usage_of(usage)}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return self._head("text_completion") | {"choices": [choice], "usage": usage_of(usage)}
