"""OpenAI's chat shapes on the bus: messages and their content parts, tool calls, log-probabilities and
the extra choices of a request with `n` > 1."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from llmbus.contract.messages.base import Part

# How an image part appears in a turn's plain-text rendering (counted as prompt there): never its URL,
# which may be a data URL of megabytes.
IMAGE_PLACEHOLDER = "<|image|>"


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"
    TOOL_CALLS = "tool_calls"  # the answer is tool calls for the client to run
    CONTENT_FILTER = "content_filter"  # a hosted upstream's filter cut the answer


class FunctionCall(Part):
    name: str = Field(max_length=256)
    arguments: str = Field(default="", max_length=2_000_000, description="JSON text, as the model wrote it.")


class ToolCall(Part):
    """OpenAI's tool call: on an assistant message of a chat, and on a result."""

    id: str = Field(max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallDelta(Part):
    name: str | None = Field(default=None, max_length=256)
    arguments: str | None = Field(default=None, max_length=2_000_000)


class ToolCallDelta(Part):
    """One streamed fragment of a tool call (OpenAI's `delta.tool_calls[]`): `index` names the call,
    its first fragment brings id, type and name, and `arguments` comes in pieces to concatenate."""

    index: int = Field(ge=0, le=1023)
    id: str | None = Field(default=None, max_length=256)
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


class TextContent(Part):
    type: Literal["text"] = "text"
    text: str = Field(max_length=2_000_000)


class ImageUrl(Part):
    url: str = Field(min_length=1, max_length=20_000_000, description="https:// or a data: URL (base64).")
    detail: Literal["auto", "low", "high"] | None = None


class ImageContent(Part):
    type: Literal["image_url"] = "image_url"
    image_url: ImageUrl


ContentPart = Annotated[TextContent | ImageContent, Field(discriminator="type")]


class ChatMessage(Part):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str = Field(default="", max_length=2_000_000, description="The message's text (its text parts joined).")
    content_parts: list[ContentPart] | None = Field(
        default=None,
        max_length=256,
        description="OpenAI's content parts as sent, where a part is not text (an image): engines that take "
        "images get these; `content` holds the text parts for everything else (counting, caching, scoring).",
    )
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[ToolCall] | None = Field(
        default=None, max_length=128, description="An assistant message's tool calls (OpenAI's shape)."
    )
    tool_call_id: str | None = Field(default=None, max_length=256, description="A tool message: the call it answers.")

    @property
    def images(self) -> int:
        return sum(isinstance(part, ImageContent) for part in self.content_parts or ())

    @property
    def instructs(self) -> bool:
        """A system or developer message: instructions, kept when a conversation is trimmed."""
        return self.role in ("system", "developer")

    def rendered(self) -> str:
        """The turn in the plain-text rendering (prompt_text): role-tagged, an assistant's tool calls
        as `name(arguments)` lines, so that they are counted and a completions API sees them; an image
        as a placeholder."""
        calls = "".join(f"{c.function.name}({c.function.arguments})\n" for c in self.tool_calls or ())
        return f"<|{self.role}|>\n{IMAGE_PLACEHOLDER * self.images}{self.content}\n{calls}"


def tools_text(tools: list[dict[str, Any]] | None) -> str:
    """The tool definitions as the text a chat template writes them in (their JSON), for counting."""
    return "".join(json.dumps(tool, ensure_ascii=False, separators=(", ", ": ")) + "\n" for tool in tools or ())


class ResponseFormat(Part):
    """OpenAI's `response_format`: free text, any JSON object, or JSON that follows `json_schema`."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = Field(
        default=None, description="OpenAI's json_schema object: name, schema, strict (type json_schema only)."
    )

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("`json_schema` is required with type json_schema, and only then")
        if self.json_schema is not None and not isinstance(self.json_schema.get("schema"), dict):
            raise ValueError("`json_schema.schema` must be a JSON schema object")
        return self

    @property
    def constrains(self) -> bool:
        return self.type != "text"


class TopLogprob(Part):
    token: str = Field(max_length=1024)
    logprob: float
    bytes: list[int] | None = Field(default=None, max_length=4096)


class TokenLogprob(Part):
    """One generated token's log-probability and its most likely alternatives (OpenAI's
    `choices[].logprobs.content[]`)."""

    token: str = Field(max_length=1024)
    logprob: float
    bytes: list[int] | None = Field(default=None, max_length=4096)
    top_logprobs: list[TopLogprob] = Field(default_factory=list, max_length=20)


class ChoiceDelta(Part):
    """What one chunk carries of a choice other than the first (a request with `n` > 1)."""

    index: int = Field(ge=1, le=127)
    delta: str = ""
    tool_calls: list[ToolCallDelta] | None = None
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = Field(default=None, description="Set on the chunk where this choice ended.")


class Choice(Part):
    """A choice other than the first, complete, on a result (the first is the result's own text)."""

    index: int = Field(ge=1, le=127)
    text: str = ""
    tool_calls: list[ToolCall] | None = None
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None
