"""The one interface every engine (vllm, sim, openai-http) implements for the worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from llmbus.contract.engine_features import features_of
from llmbus.contract.messages import RETRYABLE, ChatMessage, ErrorCode, ToolCallDelta


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt: str  # a completion prompt, or a chat's plain-text rendering (InferenceRequest.prompt_text)
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    priority: int = 0
    # OpenAI's shapes, for the engines that support them (llmbus.contract.engine_features); None: not asked.
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    suffix: str | None = None
    trace_headers: dict[str, str] = field(default_factory=dict)
    # The chat as sent (empty for a completion prompt): engines that know the model's chat format
    # (vLLM's chat template, a chat API) use it instead of `prompt`.
    messages: tuple[ChatMessage, ...] = ()


@dataclass(slots=True)
class EngineOutput:
    """What one engine step produced for one request (cumulative counts, new text).

    Made once per token: not frozen, because a frozen dataclass's __init__ (one
    object.__setattr__ per field) costs about four times as much. Treat it as a value.
    """

    delta: str
    new_tokens: int
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "tool_calls"
    preemptions: int = 0  # times the engine preempted this request so far (0 where not known)
    tool_calls: list[ToolCallDelta] | None = None  # tool call fragments of this step (hosted chat APIs)


@dataclass(frozen=True)
class EngineStats:
    """Gauges and counters with vLLM's meaning (see vllm/v1/metrics)."""

    num_requests_running: int = 0
    num_requests_waiting: int = 0
    kv_block_size: int = 16
    kv_blocks_total: int = 0
    kv_blocks_free: int = 0
    kv_cache_usage_perc: float = 0.0
    prefix_cache_queries_total: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits_total: int = 0  # of which found in the GPU's prefix cache
    # of which loaded from a KV offloading tier instead (vLLM's external_prefix_cache_hits)
    external_prefix_cache_hits_total: int = 0
    kv_offload_blocks_total: int = 0  # blocks the offloading tier holds (0: none)
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    num_preemptions_total: int = 0


class EngineError(Exception):
    """A failure the worker turns into an outcome. Three questions decide what happens next:

    - `restarts_engine`: the engine itself is gone (a dead core, also after an OOM): restart it. Only then —
      one request's failure must not abort every other request on the worker.
    - `retryable`: another attempt elsewhere may succeed (scheduler retries); if not, the
      request gets its final error now (a 4xx, a validation error: retrying cannot help).
    - `retry_after_s` (UpstreamBusy): the worker cools down this long before taking more.
    """

    code: ErrorCode = ErrorCode.ENGINE_FAILED
    restarts_engine: bool = False

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE


class AdmissionError(EngineError):
    """Refused before starting: prompt + max_tokens exceed the model length or free KV."""

    code = ErrorCode.OVER_CAPACITY


class RequestRejected(EngineError):
    """The request itself is wrong (upstream 400/404/413/422, vLLM validation): final, not retried."""

    code = ErrorCode.INVALID_REQUEST


class UpstreamBusy(EngineError):
    """Upstream said 429 / 503: try another worker; this one cools down for `retry_after_s`."""

    code = ErrorCode.OVER_CAPACITY

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineOOM(EngineError):
    """One request ran out of memory while the engine lives on (vLLM fails that request only):
    no restart — it would abort every other request here. An OOM that kills the engine core is
    an EngineDead with this code. The scheduler retries it once, on a worker with more free KV."""

    code = ErrorCode.ENGINE_OOM


class EngineDead(EngineError):
    code = ErrorCode.ENGINE_FAILED
    restarts_engine = True


class Engine(Protocol):
    name: str  # "vllm" | "sim" | "openai-http"
    model: str
    max_model_len: int
    max_num_seqs: int

    async def start(self) -> None: ...

    async def warmup(self) -> None: ...

    def count_tokens(self, text: str) -> int: ...

    def check_admission(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise AdmissionError if the request cannot be taken now."""
        ...

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    async def stop(self) -> None: ...


def honoured_features(engine: Engine) -> frozenset[str]:
    """What `engine` honours beyond text: its own `features` where its configuration decides (vLLM
    with or without a FIM format), else its kind's (llmbus.contract.engine_features)."""
    own = getattr(engine, "features", None)
    return frozenset(own) if own is not None else features_of(engine.name)
