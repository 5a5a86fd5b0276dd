"""The OpenAI request bodies the gateway accepts (what the official SDK sends).

Every parameter the OpenAI API defines for these endpoints is either carried on the request to the
engines (unset ones stay unset: the model's own defaults apply) or refused with a 400 naming it;
none is dropped. What each engine does with each is in the service's README; a parameter the engine
serving the request cannot honour is a 400 naming it too (llmbus.contract.engine_features). The
legacy `functions`, `echo` and `best_of` > 1 are refused here.

vLLM's sampling extras (`top_k`, `min_p`, `repetition_penalty`) are accepted as `vllm serve` accepts
them: as extra body fields (the SDK's `extra_body`). So are llmbus's routing hints: `category`,
`token_budget`, `session_id`, `priority`, `complexity`, `adapter` (a LoRA adapter of `model`; see
core/hints.py for the headers), and `migration_limit`. Fields the OpenAI API does not define are ignored,
as `vllm serve` ignores them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmbus.contract.messages import ImageUrl, ResponseFormat, ToolCall


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
    n: int | None = Field(default=None, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = Field(default=None, max_length=256)
    metadata: dict[str, str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    # vLLM's sampling extras (extra body fields, as `vllm serve` takes them)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    # llmbus routing hints (InferenceRequest's fields of the same names)
    category: str | None = Field(default=None, max_length=64)
    token_budget: int | None = Field(default=None, ge=0)
    session_id: str | None = Field(default=None, max_length=256)
    priority: int | None = Field(default=None, ge=0, le=9)
    complexity: float | None = Field(default=None, ge=0.0, le=1.0)
    adapter: str | None = Field(default=None, max_length=256)  # a LoRA adapter of `model`
    migration_limit: int | None = Field(default=None, ge=1, le=16)  # legs a cut answer may have (delivery.md)

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 16:
            raise ValueError("at most 16 stop sequences")
        return value

    def check_supported(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise Unsupported("stream_options", "stream_options is only allowed when stream is true")

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling(self) -> dict[str, object]:
        """The sampling parameters the body sets (an unset one is left out: the model's default applies)."""
        names: tuple[str, ...] = ("temperature", "top_p", "seed", "n", "presence_penalty", "frequency_penalty")
        names += ("logit_bias",)
        names += ("top_k", "min_p", "repetition_penalty")
        return {name: value for name in names if (value := getattr(self, name)) is not None}


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ImagePart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["image_url"]
    image_url: ImageUrl


class OtherPart(BaseModel):
    """A content part of a kind llmbus does not carry (audio, files): refused by name."""

    model_config = ConfigDict(extra="allow")
    type: Literal["input_audio", "file", "refusal"]


ContentPartIn = Annotated[TextPart | ImagePart | OtherPart, Field(discriminator="type")]


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPartIn] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    def parts(self) -> list[TextPart | ImagePart] | None:
        """The content parts where one is not text (they travel as sent), else None (the text is enough)."""
        if not isinstance(self.content, list) or all(isinstance(part, TextPart) for part in self.content):
            return None
        for part in self.content:
            if isinstance(part, OtherPart):
                raise Unsupported("messages", f"content parts of type {part.type!r} are not supported")
        return [part for part in self.content if isinstance(part, TextPart | ImagePart)]


class ChatCompletionBody(_Body):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    reasoning_effort: str | None = Field(default=None, max_length=32, pattern=r"^[a-z_]+$")

    def check_supported(self) -> None:
        super().check_supported()
        if self.functions or self.function_call is not None:
            name = "functions" if self.functions else "function_call"
            raise Unsupported(name, "the legacy `functions` / `function_call` are not supported: send `tools`")
        if self.top_logprobs is not None and not self.logprobs:
            raise Unsupported("top_logprobs", "top_logprobs needs logprobs: true")
        if self.parallel_tool_calls is not None and not self.tools:
            raise Unsupported("parallel_tool_calls", "parallel_tool_calls is only allowed when tools are given")
        for message in self.messages:
            message.parts()  # a part of a kind llmbus does not carry: refused here, by name

    def output_cap_tokens(self) -> int | None:
        """The client's bound on the answer: max_completion_tokens, or the older max_tokens."""
        return self.max_completion_tokens or self.max_tokens

    def sampling(self) -> dict[str, object]:
        chat: dict[str, object] = {
            "parallel_tool_calls": self.parallel_tool_calls,
            "reasoning_effort": self.reasoning_effort,
        }
        if self.logprobs:
            chat |= {"logprobs": True, "top_logprobs": self.top_logprobs}
        return super().sampling() | {name: value for name, value in chat.items() if value is not None}


class CompletionBody(_Body):
    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5)  # the legacy API's: alternatives per token
    best_of: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise Unsupported("prompt", "exactly one prompt per request is supported")
        if self.echo:
            raise Unsupported("echo", "echo is not supported")
        if self.best_of not in (None, 1, self.n):
            raise Unsupported("best_of", "best_of other than n is not supported")

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def sampling(self) -> dict[str, object]:
        if self.logprobs is None:
            return super().sampling()
        return super().sampling() | {"logprobs": True, "top_logprobs": self.logprobs}
