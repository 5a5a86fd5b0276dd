"""The one interface every engine (vllm, sim, openai-http) implements for the worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from llmbus.contract.engine_features import features_of
from llmbus.contract.messages import (
    RETRYABLE,
    ChatMessage,
    Continuation,
    ErrorCode,
    LegEnd,
    LoraAdapter,
    TokenLogprob,
    ToolCallDelta,
)
from llmbus_services.engine_worker.core.lora_slots import AdapterRefused, AdapterSlots


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt: str  # a completion prompt, or a chat's plain-text rendering (InferenceRequest.prompt_text)
    max_tokens: int
    # Sampling: None is "not set" (vLLM applies the model's generation config, an upstream its default).
    temperature: float | None = None
    top_p: float | None = None
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
    adapter: LoraAdapter | None = None  # a LoRA adapter of the engine's model to generate with (None: the base)
    # The client set no max_tokens: `max_tokens` is the model's output cap, and the answer may take what
    # the window leaves of it (answer_room); an upstream is sent no bound at all.
    max_tokens_auto: bool = False
    # OpenAI's further parameters and vLLM's extras (llmbus.contract.engine_features says who honours which).
    n: int = 1
    logprobs: bool = False
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    # The catalog's tokenizer reference for the model (the one the router counted with): engines without
    # a tokenizer of their own count with it, so their usage agrees with the router's count.
    tokenizer: str | None = None
    # The answer so far, when this run is the next leg of an answer cut mid-stream (core/continuation.py):
    # the engine generates what follows `continuation.text` (the prompt, then that text as the start of the
    # assistant's answer), and `max_tokens` is what is left of the request's.
    continuation: Continuation | None = None
    # Prefix caches are shared only between requests of one salt (RoutedRequest.cache_salt: a tenant's,
    # or its cache group's); "": the engine's unsalted cache (warm-ups, probes).
    cache_salt: str = ""


def answer_room(prompt_tokens: int, max_tokens: int, auto: bool, max_model_len: int) -> int:
    """The answer's bound on an engine of `max_model_len`: an unset max_tokens (`auto`) takes what the
    window leaves of the output cap, at least one token (vllm serve's rule); a set one stays as asked."""
    return max(1, min(max_tokens, max_model_len - prompt_tokens)) if auto else max_tokens


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
    # n > 1: the choice this output belongs to. `finish_reason` is set when that choice ends; `finished`
    # (and the counts, over every choice) when the whole request does.
    index: int = 0
    logprobs: list[TokenLogprob] | None = None  # the log-probabilities of this step's tokens (if asked)
    # An engine that serves one request with several models or upstreams (a hosted fallback): which one
    # generated this output. None: the engine's own model, its one upstream.
    model: str | None = None
    deployment: str | None = None


@dataclass(frozen=True)
class EngineStats:
    """Gauges and counters with vLLM's meaning (see vllm/v1/metrics)."""

    num_requests_running: int = 0
    num_requests_waiting: int = 0
    # Prompt tokens admitted and not yet prefilled (no vLLM gauge has it; 0 where an engine cannot tell).
    prefill_backlog_tokens: int = 0
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
    """Refused before starting: prompt + max_tokens exceed the model length or free KV. `prompt_tokens`:
    the engine's count of the prompt as the model would see it (chat template and tools included), which
    goes to the scheduler: when no worker can take that many, the request ends prompt_too_long."""

    code = ErrorCode.OVER_CAPACITY

    def __init__(self, message: str, prompt_tokens: int = 0) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens


class RequestRejected(EngineError):
    """The request itself is wrong (upstream 400/404/413/422, vLLM validation): final, not retried.
    `param`: the request's parameter at fault, where known (OpenAI's `param`)."""

    code = ErrorCode.INVALID_REQUEST

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UpstreamFailed(EngineError):
    """A hosted model's upstream did not answer: every deployment failed, stalled, broke off or is busy past
    the wait the worker allows (`code` MODEL_UNAVAILABLE), or it says the prompt is over its window
    (PROMPT_TOO_LONG, with its count in `prompt_tokens`). Handed back: the scheduler tries another worker of
    the model, else falls back along the route's chain at once, else ends the request with this error and its
    retry hint (`retry_after_s`: when the upstream may answer again, None when it does not say)."""

    code = ErrorCode.MODEL_UNAVAILABLE

    def __init__(
        self,
        message: str,
        code: ErrorCode | None = None,
        retry_after_s: float | None = None,
        prompt_tokens: int = 0,
    ) -> None:
        super().__init__(message, code)
        self.retry_after_s = retry_after_s
        self.prompt_tokens = prompt_tokens

    @property
    def retryable(self) -> bool:
        return True  # by another worker or another model: the scheduler decides which


class UpstreamBusy(UpstreamFailed):
    """Upstream said 429 / 503 for longer than the worker waits: try elsewhere; this one cools down for
    `retry_after_s`."""

    code = ErrorCode.OVER_CAPACITY

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.retry_after_s: float = retry_after_s


class EngineOOM(EngineError):
    """One request ran out of memory while the engine lives on (vLLM fails that request only):
    no restart — it would abort every other request here. An OOM that kills the engine core is
    an EngineDead with this code. The scheduler retries it once, on a worker with more free KV."""

    code = ErrorCode.ENGINE_OOM


class EngineDead(EngineError):
    code = ErrorCode.ENGINE_FAILED
    restarts_engine = True


class LegCut(EngineError):
    """The engine's run ended mid-answer in a way its answer can be continued from (a hosted upstream cut,
    stalled, or failed after streaming part of it): the worker records the leg (`ended`, and the
    `model` / `deployment` that served it) and the next leg continues from exactly what was streamed.

    `in_process`: the engine can go on itself (another deployment, the next model of the route's chain):
    the worker calls `generate` again at once with the continuation (core/continuation.py), whose legs
    say which upstreams already failed. Otherwise the request is handed back and the scheduler places
    the next leg on another worker. Either way the client sees one answer."""

    code = ErrorCode.ENGINE_FAILED

    def __init__(
        self,
        message: str,
        *,
        ended: LegEnd = LegEnd.UPSTREAM_FAILED,
        in_process: bool = False,
        model: str | None = None,
        deployment: str | None = None,
        code: ErrorCode | None = None,
    ) -> None:
        super().__init__(message, code)
        self.ended = ended
        self.in_process = in_process
        self.model = model
        self.deployment = deployment

    @property
    def retryable(self) -> bool:
        return True  # a next leg continues it, whatever its code says of the model (model_unavailable: the chain)


class Engine(Protocol):
    name: str  # "vllm" | "sim" | "onnx" | "openai-http"
    model: str
    max_model_len: int
    max_num_seqs: int

    async def start(self) -> None: ...

    async def warmup(self) -> None: ...

    def count_tokens(self, text: str, tokenizer: str | None = None) -> int:
        """`text`'s tokens by the engine's tokenizer; an engine without one of its own counts with
        `tokenizer` (the catalog's reference for the model), else with llmbus.tokens' estimate."""
        ...

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


def adapter_slots(engine: Engine) -> AdapterSlots | None:
    """The engine's LoRA adapter slots, where it has any (vllm and sim with max_loras > 0)."""
    slots = getattr(engine, "lora", None)
    return slots if isinstance(slots, AdapterSlots) else None


def adapter_refusal(engine: Engine, adapter: LoraAdapter | None) -> str | None:
    """Why this engine cannot generate with `adapter` (no slots, another base, too high a rank); None: it can."""
    if adapter is None:
        return None
    slots = adapter_slots(engine)
    if slots is None:
        return f"the {engine.name} engine serving {engine.model!r} loads no LoRA adapters ({adapter.name!r} asked)"
    try:
        slots.check(adapter)
    except AdapterRefused as refused:
        return str(refused)
    return None
