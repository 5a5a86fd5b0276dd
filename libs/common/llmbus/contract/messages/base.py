"""Base of every message on the bus: versioned, JSON on the wire, strict on input."""

from __future__ import annotations

import time
import uuid
from typing import ClassVar

from pydantic import BaseModel, ConfigDict


def now_ms() -> int:
    return int(time.time() * 1000)


def new_request_id() -> str:
    return uuid.uuid4().hex


class Part(BaseModel):
    """A value nested inside messages (no version of its own)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Message(BaseModel):
    """A message of the llmbus contract.

    `SCHEMA_VERSION` is bumped on any incompatible change; readers accept every version up
    to their own (fields added later have defaults), and the version travels in the
    `llmbus-schema` header as `<Name>/<version>`.

    Models are strict when built in code (a misspelt field is a bug). On the wire, readers
    ignore fields they do not know (llmbus.bus.codec), except on client input: a model with
    `STRICT_INPUT` refuses them, and its JSON Schema says `additionalProperties: false`.
    """

    model_config = ConfigDict(extra="forbid", frozen=False, populate_by_name=True)

    SCHEMA_VERSION: ClassVar[int] = 1
    STRICT_INPUT: ClassVar[bool] = False
    schema_version: int = 1

    @classmethod
    def schema_name(cls) -> str:
        return f"{cls.__name__}/{cls.SCHEMA_VERSION}"

    def to_bytes(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Message:
        return cls.model_validate_json(raw)
