"""Settings of one `openai-http` upstream, validated (unknown keys refused) before the worker starts.

A worker serves one model; the upstreams file (LLMBUS_WORKER_OPENAI_UPSTREAMS_FILE) describes every
hosted model of a fleet, and each worker takes the entry of its own model (LLMBUS_WORKER_MODEL).
Without a file the worker builds one entry from LLMBUS_WORKER_OPENAI_BASE_URL / _API_KEY / _MODEL.
An entry may list several deployments of its model (keys, base URLs, regions), each with its own
limits and health; one without `deployments` is its own single deployment.
The settings are documented in OPENAI_HTTP.md beside this file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from llmbus.contract.config_file import StrictModel, load_yaml
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.breaker import BreakerConfig

# Without a setting and without a catalog entry for the model (ModelSpec on llm.models).
DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_MAX_NUM_SEQS = 64

# How an upstream continues an answer another leg began (OPENAI_HTTP.md, "Failures"): `none`, or the partial
# answer as the final assistant message with vLLM's / SGLang's `continue_final_message` (and no generation
# prompt), or with the `prefix: true` flag of DeepSeek's and Mistral's chat APIs. A completions API always can.
Continuation = Literal["none", "continue_final_message", "prefix"]


class DeploymentConfig(StrictModel):
    """One deployment of the entry's model: what it leaves unset is the entry's."""

    name: str | None = Field(default=None, min_length=1, description="In logs and errors; default: deployment-<n>.")
    base_url: str | None = Field(default=None, min_length=1)
    upstream_model: str | None = None
    api_key: str | None = Field(default=None, repr=False)
    api_key_env: str | None = None
    api_key_header: str | None = None
    region: str | None = Field(default=None, description="A label, in logs and errors.")
    extra_headers: dict[str, str] | None = None
    extra_query: dict[str, str] | None = None
    continuation: Continuation | None = None
    rpm: int | None = Field(default=None, ge=1, description="Requests per minute this deployment allows.")
    tpm: int | None = Field(default=None, ge=1, description="Tokens (prompt + answer bound) per minute.")


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
    max_model_len: int = Field(
        default=DEFAULT_MAX_MODEL_LEN, ge=16, description="The upstream model's context: prompt + output."
    )
    max_num_seqs: int = Field(
        default=DEFAULT_MAX_NUM_SEQS, ge=1, description="Streams in flight at once; more are refused (retried)."
    )
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = Field(
        default="max_tokens",
        description="How the upstream takes the answer's bound: reasoning models on OpenAI's API take only "
        "max_completion_tokens; older servers only max_tokens. An unset max_tokens sends neither.",
    )
    developer_role: bool = Field(
        default=False,
        description="Send `developer` messages as they are (OpenAI's API); False: as `system`, which every "
        "OpenAI-compatible server takes.",
    )
    refuses: list[str] = Field(
        default_factory=list,
        description="Parameters this upstream refuses (e.g. vLLM's top_k, min_p, repetition_penalty on "
        "OpenAI's API): the worker does not offer them, so a request asking for one is a 400 naming it.",
    )
    connect_timeout_s: float = Field(default=5.0, gt=0)
    # Failure policy (OPENAI_HTTP.md, "Upstream errors"); first token and gaps measured by bench/openai_gaps.py.
    first_token_timeout_s: float = Field(
        default=10.0, gt=0, description="Sent to the first token (text, tool call or reasoning), for a short prompt."
    )
    first_token_prompt_tokens_per_s: float = Field(
        default=10_000.0, gt=0, description="The first token's deadline grows by prompt tokens / this (prefill)."
    )
    stall_timeout_s: float = Field(
        default=5.0, gt=0, description="Longest silence between two tokens once the answer has begun."
    )
    request_timeout_s: float = Field(default=600.0, gt=0, description="Whole request, first byte to last.")
    retries: int = Field(default=1, ge=0, description="Tries again on the same deployment after a transient error.")
    retry_backoff_s: float = Field(default=0.25, ge=0, description="Wait before such a try, without a Retry-After.")
    max_retry_after_s: float = Field(
        default=2.0, ge=0, description="A Retry-After up to this is waited out; a longer one falls back at once."
    )
    continuation: Continuation = "none"
    extra_headers: dict[str, str] = Field(default_factory=dict)
    extra_query: dict[str, str] = Field(default_factory=dict, description='e.g. Azure\'s {"api-version": "..."}.')
    extra_body: dict[str, Any] = Field(default_factory=dict)
    busy_cooldown_s: float = Field(default=1.0, ge=0, description="After a 429 / 503 without Retry-After.")
    # Connections per HTTP client: max_num_seqs streams are spread over ceil(max_num_seqs / this)
    # clients, each keeping all its connections alive (see deployments.Deployment).
    connections_per_pool: int = Field(default=4, ge=1)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    tokenizer: str | None = Field(
        default=None, description="The upstream model's tokenizer (an llmbus.tokens reference); none: the estimate."
    )
    rpm: int | None = Field(default=None, ge=1, description="Requests per minute (the single deployment's).")
    tpm: int | None = Field(default=None, ge=1, description="Tokens per minute (the single deployment's).")
    deployments: list[DeploymentConfig] = Field(
        default_factory=list, description="Several deployments of the model; none: the entry is its only one."
    )

    def resolved_deployments(self) -> list[DeploymentConfig]:
        """Every deployment with what it leaves unset taken from the entry, named."""
        inherited: tuple[str, ...] = ("base_url", "upstream_model", "api_key", "api_key_env", "api_key_header")
        inherited += ("continuation", "extra_headers", "extra_query", "rpm", "tpm")
        own = self.deployments or [DeploymentConfig()]
        resolved = []
        for n, deployment in enumerate(own, start=1):
            update: dict[str, Any] = {k: getattr(self, k) for k in inherited if getattr(deployment, k) is None}
            update["name"] = deployment.name or (f"deployment-{n}" if self.deployments else self.model)
            update["upstream_model"] = deployment.upstream_model or self.upstream_model or self.model
            resolved.append(deployment.model_copy(update=update))
        names = [d.name for d in resolved]
        if len(set(names)) != len(names):
            raise ValueError(f"upstream {self.model!r}: deployment names repeat: {names}")
        return resolved

    # shared: the upstream's prompt cache serves every tenant of this account alike (a hosted provider):
    #   its cached_tokens would tell one tenant what another sent, so none are reported (the worker's
    #   stats still count them). salted: the upstream keys its prefix cache by the body's `cache_salt`
    #   (vLLM's OpenAI-compatible server): the tenant's salt is sent and its cached tokens reported.
    prompt_cache: Literal["shared", "salted"] = "shared"


class UpstreamsFile(StrictModel):
    upstreams: list[OpenAIHttpConfig] = Field(min_length=1)


def load_upstreams(path: str | Path) -> dict[str, OpenAIHttpConfig]:
    """Model name → its upstream; a model listed twice is an error (which one would be meant?)."""
    parsed = load_yaml(path, UpstreamsFile)
    by_model: dict[str, OpenAIHttpConfig] = {}
    for entry in parsed.upstreams:
        if entry.model in by_model:
            raise ValueError(f"{path}: model {entry.model!r} is listed twice")
        entry.resolved_deployments()  # names that repeat stop the start here
        by_model[entry.model] = entry
    return by_model


def openai_config(settings: WorkerSettings) -> OpenAIHttpConfig:
    """The upstream of the worker's model: its entry of the upstreams file, or one built from the
    LLMBUS_WORKER_OPENAI_* settings. The window and the streams in flight come from the file or the
    settings where they say them, else from the model's catalog entry (the worker's settings carry the
    ModelSpec's: core/node_plan.py), else the defaults above."""
    catalog: dict[str, Any] = {
        "max_model_len": settings.openai_max_model_len,
        "max_num_seqs": settings.openai_max_num_seqs,
        "tokenizer": settings.tokenizer,
    }
    if settings.openai_upstreams_file:
        upstreams = load_upstreams(settings.openai_upstreams_file)
        if settings.model not in upstreams:
            raise ValueError(
                f"{settings.openai_upstreams_file} has no upstream for model {settings.model!r}; "
                f"it lists {sorted(upstreams)}"
            )
        chosen = upstreams[settings.model]
        unset = {k: v for k, v in catalog.items() if k not in chosen.model_fields_set and v is not None}
        return chosen.model_copy(update=unset)  # what the file says wins
    return OpenAIHttpConfig(
        model=settings.model,
        base_url=settings.openai_base_url,
        api_key=settings.openai_api_key,
        upstream_model=settings.openai_model or settings.model,
        max_tokens_param=settings.openai_max_tokens_param,
        developer_role=settings.openai_developer_role,
        prompt_cache=settings.openai_prompt_cache,
        **{k: v for k, v in catalog.items() if v is not None},
    )
