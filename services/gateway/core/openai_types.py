"""The OpenAI request bodies the gateway accepts (what the official SDK sends).

Parameters that would change the answer in ways llmbus cannot honour (several choices,
legacy functions, log-probabilities, echo) are refused with a 400 naming the parameter, instead
of being silently ignored; harmless ones (penalties, logit bias, ...) are accepted and ignored.
`response_format`, `tools` and `suffix` travel on the request to engines that support them
(llmbus.contract.engine_features); the others refuse them with a 400.

llmbus's routing hints are extra body fields (the SDK's `extra_body`): `category`,
`token_budget`, `session_id`, `priority`, `complexity` (see core/hints.py for the headers).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmbus.contract.messages import ResponseFormat, ToolCall


class Unsupported(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = Field(default=None, max_length=256)
    metadata: dict[str, str] | None = None
    # llmbus routing hints (InferenceRequest's fields of the same names)
    category: str | None = Field(default=None, max_length=64)
    token_budget: int | None = Field(default=None, ge=0)
    session_id: str | None = Field(default=None, max_length=256)
    priority: int | None = Field(default=None, ge=0, le=9)
    complexity: float | None = Field(default=None, ge=0.0, le=1.0)

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 16:
            raise ValueError("at most 16 stop sequences")
        return value

    def check_supported(self) -> None:
        if self.n != 1:
            raise Unsupported("n", "only n=1 is supported")
        if self.stream_options is not None and not self.stream:
            raise Unsupported("stream_options", "stream_options is only allowed when stream is true")

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionBody(_Body):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    tool_choice: str | dict[str, Any] | None = None
    functions: list[Any] | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.functions:
            raise Unsupported("functions", "the legacy `functions` are not supported: send `tools`")
        if self.logprobs:
            raise Unsupported("logprobs", "logprobs are not supported")

    def output_cap_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionBody(_Body):
    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise Unsupported("prompt", "exactly one prompt per request is supported")
        if self.echo:
            raise Unsupported("echo", "echo is not supported")
        if self.logprobs is not None:
            raise Unsupported("logprobs", "logprobs are not supported")
        if self.best_of not in (None, 1):
            raise Unsupported("best_of", "only best_of=1 is supported")

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]
