"""OpenAI bodies -> InferenceRequest, and llmbus chunks -> OpenAI response objects (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmbus.contract.messages import (
    ChatMessage,
    ContentPart,
    FinishReason,
    ImageContent,
    InferenceRequest,
    TextContent,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from llmbus_services.gateway.core.openai_types import (
    ChatCompletionBody,
    ChatMessageIn,
    CompletionBody,
    ImagePart,
    TextPart,
)

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
        "stream": body.stream,
        "metadata": body.metadata or {},
    }
    fields |= body.sampling()  # only what the body sets: the model's own defaults apply to the rest
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
    """A chat message for the bus: its role as sent (`developer` too: each engine passes or converts it),
    its text, its content parts where one is an image, and its name and tool-call fields where it has them."""
    parts = message.parts()
    return ChatMessage(
        role=message.role,
        content=message.text(),
        content_parts=[_part(part) for part in parts] if parts else None,
        name=message.name,
        tool_calls=message.tool_calls,
        tool_call_id=message.tool_call_id,
    )


def _part(part: TextPart | ImagePart) -> ContentPart:
    if isinstance(part, TextPart):
        return TextContent(text=part.text)
    return ImageContent(image_url=part.image_url)


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
class ChoiceOut:
    """One choice's part of a response: all of it (a plain answer), or what a stream sends now."""

    index: int = 0
    text: str = ""
    tool_calls: list[ToolCallDelta] | list[ToolCall] | None = None
    logprobs: list[TokenLogprob] | None = None
    finish: str | None = None


def _legacy_logprobs(logprobs: list[TokenLogprob]) -> dict[str, object]:
    """The completions API's older shape: parallel lists, the alternatives as {token: logprob}."""
    offsets, at = [], 0
    for entry in logprobs:
        offsets.append(at)
        at += len(entry.token)
    return {
        "tokens": [entry.token for entry in logprobs],
        "token_logprobs": [entry.logprob for entry in logprobs],
        "top_logprobs": [{alt.token: alt.logprob for alt in entry.top_logprobs} for entry in logprobs],
        "text_offset": offsets,
    }


@dataclass
class ResponseShape:
    """Builds the OpenAI objects of one response (chat.completion or text_completion)."""

    kind: Kind
    request_id: str
    created_s: int
    model: str
    logprobs: bool = False  # the request asked for them: every choice carries a logprobs object

    @property
    def response_id(self) -> str:
        return f"{'chatcmpl' if self.kind == 'chat' else 'cmpl'}-{self.request_id}"

    def _head(self, obj: str) -> dict[str, object]:
        return {"id": self.response_id, "object": obj, "created": self.created_s, "model": self.model}

    def _logprobs(self, logprobs: list[TokenLogprob] | None) -> dict[str, object] | None:
        if not self.logprobs:
            return None
        if self.kind == "chat":
            return {"content": [entry.model_dump(mode="json") for entry in logprobs or ()], "refusal": None}
        return _legacy_logprobs(logprobs or [])

    def stream_chunk(self, choice: ChoiceOut, *, first: bool, include_usage: bool) -> dict[str, object]:
        logprobs = self._logprobs(choice.logprobs)
        if self.kind == "chat":
            calls = choice.tool_calls
            # OpenAI's deltas: a tool call fragment comes with `content` only where there is text.
            message: dict[str, object] = {"content": choice.text} if choice.text or not calls else {}
            if first:
                message["role"] = "assistant"
                message.setdefault("content", None)
            if calls:
                message["tool_calls"] = [call.model_dump(mode="json", exclude_none=True) for call in calls]
            body: dict[str, object] = {"index": choice.index, "delta": message, "logprobs": logprobs}
            out = self._head("chat.completion.chunk") | {"choices": [body | {"finish_reason": choice.finish}]}
        else:
            body = {"index": choice.index, "text": choice.text, "logprobs": logprobs, "finish_reason": choice.finish}
            out = self._head("text_completion") | {"choices": [body]}
        if include_usage:
            out["usage"] = None  # OpenAI: null on every chunk but the last, usage-only one
        return out

    def usage_chunk(self, usage: Usage | None) -> dict[str, object]:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return self._head(obj) | {"choices": [], "usage": usage_of(usage)}

    def full(self, choices: list[ChoiceOut], usage: Usage | None) -> dict[str, object]:
        if self.kind == "chat":
            return self._head("chat.completion") | {
                "choices": [self._chat_choice(choice) for choice in choices],
                "usage": usage_of(usage),
            }
        listed = [
            {"index": c.index, "text": c.text, "logprobs": self._logprobs(c.logprobs), "finish_reason": c.finish}
            for c in choices
        ]
        return self._head("text_completion") | {"choices": listed, "usage": usage_of(usage)}

    def _chat_choice(self, choice: ChoiceOut) -> dict[str, object]:
        message: dict[str, object] = {"role": "assistant", "content": choice.text, "refusal": None}
        if choice.tool_calls:  # OpenAI: content null when the answer is only tool calls
            message["content"] = choice.text or None
            message["tool_calls"] = [call.model_dump(mode="json") for call in choice.tool_calls]
        return {
            "index": choice.index,
            "message": message,
            "logprobs": self._logprobs(choice.logprobs),
            "finish_reason": choice.finish or "stop",
        }
