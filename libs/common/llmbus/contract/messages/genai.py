"""OpenTelemetry GenAI semantic-convention names in the payloads of results and cost records.

A record's `gen_ai` object nests the convention's attributes by their dotted names: the path
`gen_ai.usage.input_tokens` in the JSON is the attribute `gen_ai.usage.input_tokens`, so a tool
that flattens JSON with "." (pandas' `json_normalize`, Flink's ROW access, jq paths) gets the
convention's names as they are. The object is derived: it is written from the record's own
fields each time the record is serialized and dropped when one is read, so it can never
disagree with them (llmbus code reads the fields). schemas/README.md lists what maps to what.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, computed_field, field_validator

from llmbus.contract import semconv as sc
from llmbus.contract.messages.base import Message, Part

GEN_AI = "gen_ai"


class GenAiCacheRead(Part):
    input_tokens: int | None = Field(default=None, description="gen_ai.usage.cache_read.input_tokens")


class GenAiUsage(Part):
    input_tokens: int | None = Field(
        default=None, description="gen_ai.usage.input_tokens: every prompt token, cached ones included."
    )
    output_tokens: int | None = Field(default=None, description="gen_ai.usage.output_tokens")
    cache_read: GenAiCacheRead | None = Field(
        default=None, description="cache_read.input_tokens: prompt tokens served from the engine's prefix cache."
    )


class GenAiResponse(Part):
    model: str | None = Field(default=None, description="gen_ai.response.model: the model that answered.")
    finish_reasons: list[str] | None = Field(default=None, description="gen_ai.response.finish_reasons")


class GenAiConversation(Part):
    id: str | None = Field(default=None, description="gen_ai.conversation.id: the request's session id.")


class GenAiAttributes(Part):
    """The OTel GenAI attributes of a record, nested by their dotted names (derived from its fields)."""

    response: GenAiResponse | None = None
    usage: GenAiUsage | None = None
    conversation: GenAiConversation | None = None


def nest(attributes: dict[str, Any]) -> dict[str, Any]:
    """`{"gen_ai.usage.input_tokens": 3}` as `{"usage": {"input_tokens": 3}}` (the `gen_ai` object);
    None values left out."""
    out: dict[str, Any] = {}
    for name, value in attributes.items():
        if value is None:
            continue
        *parents, leaf = name.removeprefix(f"{GEN_AI}.").split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def gen_ai_object(
    *,
    model: str | None,
    input_tokens: int,
    output_tokens: int,
    cached_input_tokens: int,
    finish_reason: str | None = None,
    session_id: str | None = None,
) -> dict[str, Any]:
    """The `gen_ai` object of a record with these facts (JSON-ready)."""
    return nest(
        {
            sc.GEN_AI_RESPONSE_MODEL: model,
            sc.GEN_AI_RESPONSE_FINISH_REASONS: [finish_reason] if finish_reason else None,
            sc.GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens,
            sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: cached_input_tokens,
            sc.GEN_AI_CONVERSATION_ID: session_id,
        }
    )


class WithGenAi(Message):
    """A message whose payload carries its `gen_ai` object, written from its fields on serialization.

    Read, `gen_ai` lands in `gen_ai_read` (validated like any field, then dropped: the fields are the
    truth); written, it is the computed field `gen_ai`, after every stored field. A computed field
    leaves the rest of the record to pydantic-core's own serializer: a wrap `model_serializer` made
    it build the whole record as a Python dict and encode that again (a small result's JSON 7.4 ->
    15.9 µs).
    """

    gen_ai_read: GenAiAttributes | None = Field(
        default=None,
        validation_alias=GEN_AI,
        exclude=True,
        description="OpenTelemetry GenAI attributes, nested by their dotted names; derived from this record's "
        "fields when it is written, ignored when it is read.",
    )

    def gen_ai_attributes(self) -> dict[str, Any] | None:
        """The record's `gen_ai` object (gen_ai_object); None where no attribute applies."""
        raise NotImplementedError

    @field_validator("gen_ai_read", mode="after")
    @classmethod
    def _derived_not_read(cls, _value: GenAiAttributes | None) -> None:
        return None

    @computed_field(alias=GEN_AI)  # type: ignore[prop-decorator]
    @property
    def gen_ai(self) -> dict[str, Any] | None:
        return self.gen_ai_attributes() or None
