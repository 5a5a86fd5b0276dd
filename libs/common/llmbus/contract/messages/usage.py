"""What a result measured: its tokens and its timings."""

from __future__ import annotations

from pydantic import Field

from llmbus.contract.messages.base import Part


class Usage(Part):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Timings(Part):
    """Milliseconds, measured by the services on the path."""

    received_at_ms: int | None = None
    queued_ms: float | None = Field(default=None, description="Received → engine started the request.")
    ttft_ms: float | None = Field(default=None, description="Received → first token.")
    total_ms: float | None = Field(default=None, description="Received → final token.")
    engine_ms: float | None = Field(default=None, description="Engine start → final token.")
    tpot_ms: float | None = Field(default=None, description="Mean time per output token after the first.")
