"""Settings of one `openai-http` upstream, validated (unknown keys refused) before the worker starts.

A worker serves one model; the upstreams file (LLMBUS_WORKER_OPENAI_UPSTREAMS_FILE) describes every
hosted model of a fleet, and each worker takes the entry of its own model (LLMBUS_WORKER_MODEL).
Without a file the worker builds one entry from LLMBUS_WORKER_OPENAI_BASE_URL / _API_KEY / _MODEL.
The settings are documented in OPENAI_HTTP.md beside this file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from llmbus.contract.config_file import StrictModel, load_yaml
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.breaker import BreakerConfig


class OpenAIHttpConfig(StrictModel):
    base_url: str = Field(min_length=1, description='Up to and including /v1, e.g. "https://api.example.com/v1".')
    model: str = Field(min_length=1, description="The name the fleet knows it by (ModelSpec.name).")
    upstream_model: str | None = Field(default=None, description="The name the server knows; default: `model`.")
    api_key: str = Field(default="", repr=False, description="From the worker's environment, never a checked-in file.")
    api_key_env: str | None = Field(default=None, description="Or: the environment variable to read it from.")
    api_key_header: str = Field(
        default="Authorization", description='"Authorization" sends "Bearer <key>"; any other header the bare key.'
    )
    # chat: every request to /chat/completions (a prompt request as one user message);
    # completions: every request to /completions (a chat rendered as text);
    # auto: chat requests to /chat/completions, prompt requests to /completions.
    api: Literal["chat", "completions", "auto"] = "chat"
    max_model_len: int = Field(default=8192, ge=16, description="The upstream model's context: prompt + output.")
    max_num_seqs: int = Field(default=64, ge=1, description="Streams in flight at once; more are refused (retried).")
    connect_timeout_s: float = Field(default=5.0, gt=0)
    read_timeout_s: float = Field(default=60.0, gt=0, description="Longest silence between two chunks.")
    request_timeout_s: float = Field(default=600.0, gt=0, description="Whole request, first byte to last.")
    extra_headers: dict[str, str] = Field(default_factory=dict)
    extra_query: dict[str, str] = Field(default_factory=dict, description='e.g. Azure\'s {"api-version": "..."}.')
    extra_body: dict[str, Any] = Field(default_factory=dict)
    busy_cooldown_s: float = Field(default=5.0, ge=0, description="After a 429 / 503 without Retry-After.")
    # Connections per HTTP client: max_num_seqs streams are spread over ceil(max_num_seqs / this)
    # clients, each keeping all its connections alive (see OpenAIHttpEngine.start).
    connections_per_pool: int = Field(default=4, ge=1)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    tokenizer: str | None = Field(
        default=None, description="The upstream model's tokenizer (an llmbus.tokens reference); none: the estimate."
    )


class UpstreamsFile(StrictModel):
    upstreams: list[OpenAIHttpConfig] = Field(min_length=1)


def load_upstreams(path: str | Path) -> dict[str, OpenAIHttpConfig]:
    """Model name → its upstream; a model listed twice is an error (which one would be meant?)."""
    parsed = load_yaml(path, UpstreamsFile)
    by_model: dict[str, OpenAIHttpConfig] = {}
    for entry in parsed.upstreams:
        if entry.model in by_model:
            raise ValueError(f"{path}: model {entry.model!r} is listed twice")
        by_model[entry.model] = entry
    return by_model


def openai_config(settings: WorkerSettings) -> OpenAIHttpConfig:
    if settings.openai_upstreams_file:
        upstreams = load_upstreams(settings.openai_upstreams_file)
        if settings.model not in upstreams:
            raise ValueError(
                f"{settings.openai_upstreams_file} has no upstream for model {settings.model!r}; "
                f"it lists {sorted(upstreams)}"
            )
        chosen = upstreams[settings.model]
        if chosen.tokenizer is None and settings.tokenizer:  # the worker's own setting, where the file names none
            return chosen.model_copy(update={"tokenizer": settings.tokenizer})
        return chosen
    return OpenAIHttpConfig(
        model=settings.model,
        base_url=settings.openai_base_url,
        api_key=settings.openai_api_key,
        upstream_model=settings.openai_model or settings.model,
        tokenizer=settings.tokenizer,
    )
