"""The request path: InferenceRequest → RoutedRequest → Dispatch → TokenChunk / InferenceResult."""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Annotated, Any, ClassVar, TypedDict

from pydantic import Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from llmbus.contract.messages.adapters import ADAPTER_NAME_PATTERN, LoraAdapter
from llmbus.contract.messages.base import Message, new_request_id, now_ms
from llmbus.contract.messages.chat import (
    ChatMessage,
    Choice,
    ChoiceDelta,
    FinishReason,
    ResponseFormat,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    tools_text,
)
from llmbus.contract.messages.errors import ErrorInfo, FinalErrorInfo
from llmbus.contract.messages.genai import WithGenAi, gen_ai_object
from llmbus.contract.messages.legs import ContinuedFrom, EarlierAttempt, Leg
from llmbus.contract.messages.release import ReleaseContext
from llmbus.contract.messages.usage import Timings, Usage
from llmbus.contract.request_key import RequestKey, request_key

DEFAULT_REPLY_TOPIC = "llm.tokens"
# The model name that means "the router's policy chooses", on the bus as at the gateway.
AUTO_MODEL = "auto"


class InferenceRequest(Message):
    """What a client produces onto llm.requests (key: session id, else request id)."""

    STRICT_INPUT: ClassVar[bool] = True  # client input: an unknown field is refused

    request_id: str = Field(default_factory=new_request_id, min_length=1, max_length=128)
    tenant: str = Field(default="default", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    user_id: str | None = Field(default=None, max_length=256)
    session_id: str | None = Field(default=None, max_length=256)
    model: str | None = Field(
        default=None,
        max_length=256,
        description=f"Explicit model, or a LoRA adapter's served name; None or {AUTO_MODEL!r} lets the router choose.",
    )
    adapter: str | None = Field(
        default=None,
        max_length=256,
        pattern=ADAPTER_NAME_PATTERN,
        description="A LoRA adapter of `model` (its base): the same as naming the adapter as the model.",
    )
    messages: list[ChatMessage] = Field(default_factory=list, max_length=10_000)
    prompt: str | None = Field(
        default=None, max_length=2_000_000, description="Plain completion prompt instead of messages."
    )
    max_tokens: int = Field(default=256, ge=1, le=1_000_000)
    max_tokens_auto: bool | None = Field(
        default=None,
        description="The client set no max_tokens: the router sets it to the model's output cap, "
        "bounded by the window the prompt leaves (the OpenAI API's behaviour).",
    )
    # Sampling: a parameter left unset stays unset end to end (the OpenAI API's and vLLM's meaning): vLLM
    # applies the model's generation config, a hosted upstream its own default. On the wire unset is
    # absent, never null (the schema's type stays what it was before these could be unset).
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | SkipJsonSchema[None] = Field(
        default=None, description="Absent: the model's default (its generation config)."
    )
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | SkipJsonSchema[None] = Field(
        default=None, description="Absent: the model's default (its generation config)."
    )
    seed: int | None = None
    stop: list[str] = Field(default_factory=list, max_length=16)
    category: str | None = Field(default=None, max_length=64, description="e.g. chat, quick_edit, tab_completion")
    complexity: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Caller's score; the router scores when absent."
    )
    token_budget: int | None = Field(default=None, ge=0)
    tenant_tier: str | None = Field(default=None, max_length=32)
    priority: int = Field(default=0, ge=0, le=9, description="0 = most urgent.")
    deadline_ms: int | None = Field(default=None, description="Absolute epoch ms after which the answer is useless.")
    reply_topic: str = Field(default=DEFAULT_REPLY_TOPIC, max_length=249, pattern=r"^[A-Za-z0-9._-]+$")
    stream: bool = True
    metadata: dict[str, str] = Field(default_factory=dict)
    created_at_ms: int = Field(default_factory=now_ms)
    # Passed to engines that can honour them (llmbus.contract.engine_features); the others refuse the request.
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128, description="OpenAI tool definitions.")
    tool_choice: str | dict[str, Any] | None = None
    suffix: str | None = Field(
        default=None, max_length=2_000_000, description="Text after the insertion point (fill-in-the-middle)."
    )
    # OpenAI's further parameters, and vLLM's sampling extras: each reaches the engines that honour it
    # (llmbus.contract.engine_features) and is refused, by name, by the others. None: not set.
    n: int | None = Field(default=None, ge=1, le=16, description="Choices to generate (None: one).")
    logprobs: bool | None = Field(default=None, description="Return each generated token's log-probability.")
    top_logprobs: int | None = Field(default=None, ge=0, le=20, description="With logprobs: alternatives per token.")
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(
        default=None, max_length=1024, description="Token id (as a string) -> bias in [-100, 100]."
    )
    parallel_tool_calls: bool | None = Field(default=None, description="With tools: may the answer call several.")
    reasoning_effort: str | None = Field(
        default=None, max_length=32, pattern=r"^[a-z_]+$", description="A reasoning model's effort (low, high, ...)."
    )
    top_k: int | None = Field(default=None, ge=-1, description="vLLM's: sample from the k likeliest (-1 or 0: all).")
    min_p: float | None = Field(default=None, ge=0.0, le=1.0, description="vLLM's: drop tokens below p x the top.")
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0, description="vLLM's: 1 is none.")
    migration_limit: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="The most legs its answer may have: an answer cut mid-stream (a worker lost, drained, out of "
        "memory; an upstream failing) is continued by a next leg; one cut more ends it with a final "
        "migration_limit error. 1: never continued. None: the worker's default (4).",
    )

    @property
    def request_key(self) -> RequestKey:
        """The key of state kept for this request: its tenant and request id together."""
        return request_key(self.tenant, self.request_id)

    @field_validator("model")
    @classmethod
    def _auto_is_no_model(cls, model: str | None) -> str | None:
        return None if model == AUTO_MODEL else model

    @field_validator("logit_bias")
    @classmethod
    def _token_ids_and_biases(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for token, value in (bias or {}).items():
            if not token.isdigit() or not -100.0 <= value <= 100.0:
                raise ValueError(f"logit_bias maps token ids to biases in [-100, 100], not {token!r}: {value}")
        return bias

    @model_validator(mode="after")
    def _has_input(self) -> InferenceRequest:
        if not self.messages and self.prompt is None:
            raise ValueError("a request needs `messages` or `prompt`")
        if self.suffix is not None and self.prompt is None:
            raise ValueError("`suffix` needs a plain `prompt` (fill-in-the-middle)")
        return self

    def engine_features(self) -> set[str]:
        """What an engine must support to answer this request as asked: each parameter set to something
        else than its neutral value, named as the OpenAI API names it (llmbus.contract.engine_features)."""
        needed = {name for name, neutral in NEUTRAL.items() if getattr(self, name) not in (None, *neutral)}
        if self.response_format is not None and self.response_format.constrains:
            needed.add("response_format")
        if self.tools:
            needed.add("tools")
        elif self.parallel_tool_calls is not None:
            needed.discard("parallel_tool_calls")  # nothing to call: it changes nothing
        if self.suffix is not None:
            needed.add("suffix")
        if any(m.images for m in self.messages):
            needed.add("image_url")
        return needed

    def prompt_text(self) -> str:
        """The text the engine sees: a plain prompt, or the chat rendered as role-tagged turns."""
        if self.prompt is not None:
            return self.prompt
        return "".join(m.rendered() for m in self.messages) + GENERATION_PROMPT

    def tools_text(self) -> str:
        """The tool definitions as text (what a chat template adds to the prompt), "" without tools."""
        return tools_text(self.tools)

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def deterministic(self) -> bool:
        return self.temperature == 0.0 or self.seed is not None


# What prompt_text appends after a chat's turns.
GENERATION_PROMPT = "<|assistant|>\n"
# InferenceRequest's parameters (as the OpenAI API names them) and their neutral values: one set to
# anything else must reach an engine that honours it (`top_logprobs` goes with `logprobs`; `image_url`
# is a chat's image content part).
NEUTRAL: dict[str, tuple[object, ...]] = {
    "n": (1,),
    "logprobs": (False,),
    "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,),
    "logit_bias": ({},),
    "parallel_tool_calls": (),  # either value asks for something (with tools)
    "reasoning_effort": (),
    "top_k": (-1, 0),
    "min_p": (0.0,),
    "repetition_penalty": (1.0,),
}


class RequestFacts(TypedDict):
    """The request's facts on its result (and so on its cost record): InferenceResult's fields of these names."""

    session_id: str | None
    user_id: str | None
    category: str | None
    tier: str | None
    route_reason: str | None
    release: ReleaseContext | None
    shadowed_by: list[str] | None


class RoutedRequest(Message):
    """router → scheduler on llm.routed (key: target model)."""

    request: InferenceRequest
    model: str
    route_reason: str = "explicit"
    fallback_chain: list[str] = Field(default_factory=list)
    experiment_id: str | None = None
    variant: str | None = None
    shadow: bool = False
    prompt_tokens_est: int = 0
    prompt_tokenizer: str | None = Field(
        default=None,
        description="The tokenizer reference that counted prompt_tokens_est (counted once, by the router); "
        "None: llmbus.tokens' per-script estimate.",
    )
    trimmed_tokens: int = 0
    max_tokens_requested: int | None = Field(
        default=None, ge=1, description="The client's max_tokens when the router lowered it to the model's output cap."
    )
    received_at_ms: int = Field(default_factory=now_ms)
    routed_at_ms: int = Field(default_factory=now_ms)
    tier: str | None = Field(default=None, description="The routed model's tier in the router's policy.")
    user_ref: str | None = Field(
        default=None,
        description="The user id as results and costs carry it: HMAC-SHA256 (hex) of request.user_id where the "
        "tenant's policy says hash_user_ids, else request.user_id.",
    )
    adapter: LoraAdapter | None = Field(
        default=None,
        description="`model` is this LoRA adapter: the scheduler places it on a worker of adapter.base_model, which "
        "loads the adapter (None: a plain model).",
    )
    cache_group: str | None = Field(
        default=None,
        max_length=128,
        description="The tenants this request shares prefix caches with (the router's tenant policy, "
        "`cache_group`); None: its own tenant's alone. Not client input: the router sets it.",
    )
    release: ReleaseContext | None = Field(
        default=None,
        description="The release this request runs under (registry models): the scheduler places it only on "
        "workers of release.model_version; its result, final chunk and cost record carry it.",
    )
    attempts_before: int = Field(
        default=0,
        ge=0,
        description="Attempts it had under earlier models of its chain (a fallback): its first placement here is "
        "attempt attempts_before + 1, so attempt numbers stay unique on its reply topic.",
    )
    shadowed_by: list[str] | None = Field(
        default=None,
        description="The shadow experiments the router mirrored this request to (its result carries them: the "
        "shadow-comparator holds that result for their copies); [] none; None: not said (a cache hit, a router "
        "from before this field).",
    )

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def placement_model(self) -> str:
        """The model whose workers run it: an adapter's base model, else `model`."""
        return self.adapter.base_model if self.adapter is not None else self.model

    @property
    def cache_salt(self) -> str:
        """What prefix caches key this request's prompt blocks by besides the tokens: one value per tenant
        (or per cache group), so no tenant's prompt can hit, and so reveal, another's cached prefix.

        The scheduler's prefix hashes and the engines' caches (vLLM's `cache_salt`, the sim's block hashes)
        all take it. A digest, not the name: vLLM allows at most 128 characters and no '@', '/', '\\'.
        """
        scope = f"group:{self.cache_group}" if self.cache_group else f"tenant:{self.request.tenant}"
        return hashlib.blake2b(scope.encode(), digest_size=16).hexdigest()

    @property
    def request_key(self) -> RequestKey:
        return self.request.request_key

    def facts(self, route_reason: str | None = None) -> RequestFacts:
        """What a result of this request carries so it can be analysed without a join with llm.requests;
        `route_reason`: the result's own (a cache hit's, a coalesced follower's) in place of the routing's."""
        request = self.request
        return RequestFacts(
            session_id=request.session_id,
            user_id=self.user_ref,
            category=request.category,
            tier=self.tier,
            route_reason=route_reason or self.route_reason,
            release=self.release,
            shadowed_by=self.shadowed_by,
        )


class Dispatch(Message):
    """scheduler → one engine-worker on llm.dispatch.<worker_id> (key: request id)."""

    routed: RoutedRequest
    worker_id: str
    attempt: int = Field(default=1, ge=1)
    dispatched_at_ms: int = Field(default_factory=now_ms)
    prefix_block_hashes: list[str] = Field(default_factory=list)
    earlier: list[EarlierAttempt] = Field(
        default_factory=list,
        description="The request's attempts before this one that the scheduler placed (worker, how each ended), "
        "in order: the worker names the legs of a continued answer with them.",
    )

    @property
    def request_id(self) -> str:
        return self.routed.request.request_id

    @property
    def request_key(self) -> RequestKey:
        return self.routed.request.request_key

    @property
    def dedupe_key(self) -> str:
        return f"{self.request_key}:{self.attempt}"


class TokenChunk(Message):
    """engine-worker → the request's reply topic (key: request id); batched, ordered by seq."""

    request_id: str
    tenant: str
    seq: int = Field(ge=0)
    delta: str = ""
    tool_calls: list[ToolCallDelta] | None = Field(
        default=None,
        description="Tool call fragments in this chunk, in order (llmbus.contract.tool_calls assembles them).",
    )
    tokens: int = Field(default=0, ge=0, description="Tokens carried in this chunk.")
    final: bool = False
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: ErrorInfo | None = None
    model: str | None = None
    shadow: bool = False
    attempt: int = 1
    route_reason: str | None = Field(default=None, description="On the final chunk: the router's decision.")
    logprobs: list[TokenLogprob] | None = Field(
        default=None, description="The log-probabilities of this chunk's tokens (a request with logprobs)."
    )
    choices: list[ChoiceDelta] | None = Field(
        default=None, description="A request with n > 1: the other choices' parts (`delta` is the first's)."
    )
    release: ReleaseContext | None = Field(default=None, description="On the final chunk: the result's release.")
    continues: ContinuedFrom | None = Field(
        default=None,
        description="On every chunk of an attempt that continues an earlier one's answer (docs/delivery.md): "
        "that attempt's chunks before `continues.seq` are the start of this one's text.",
    )

    @property
    def request_key(self) -> RequestKey:
        return request_key(self.tenant, self.request_id)


class ResultStatus(StrEnum):
    OK = "ok"
    ERROR = "error"


class InferenceResult(WithGenAi):
    """Exactly one per request id on llm.results (key: request id)."""

    request_id: str
    tenant: str
    status: ResultStatus
    error: FinalErrorInfo | None = None
    model: str | None = None
    worker_id: str | None = None
    text: str = ""
    tool_calls: list[ToolCall] | None = Field(default=None, description="The answer's tool calls, assembled.")
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = Field(default=None, description="The text's tokens' log-probabilities.")
    choices: list[Choice] | None = Field(
        default=None, description="A request with n > 1: the choices after the first (`text` is the first's)."
    )
    usage: Usage = Field(default_factory=Usage)
    timings: Timings = Field(default_factory=Timings)
    cached: bool = False
    shadow: bool = False
    experiment_id: str | None = None
    variant: str | None = None
    route_reason: str | None = None
    trimmed_tokens: int = Field(default=0, ge=0, description="Prompt tokens the router trimmed to fit the window.")
    max_tokens_requested: int | None = Field(
        default=None, ge=1, description="The client's max_tokens when the router lowered it to the model's output cap."
    )
    attempt: int = 1
    produced_by: str = ""
    completed_at_ms: int = Field(default_factory=now_ms)
    # Where and on what it ran (set by the worker; `llmbus trace` shows them).
    node_id: str | None = None
    gpu: str | None = Field(default=None, description="GPU name, None on a CPU node.")
    model_version: str | None = None
    model_format: str | None = None
    preemptions: int = Field(default=0, ge=0, description="Times the engine preempted it (KV evicted, recomputed).")
    legs: list[Leg] | None = Field(
        default=None,
        description="An answer continued after a cut (docs/delivery.md): every leg in order (worker, model, tokens), "
        "each billed once; None: one leg, the result's own worker, model and usage.",
    )
    # Facts of the request (RoutedRequest.facts), so results are analysed alone, without llm.requests.
    session_id: str | None = Field(default=None, description="The request's session id (gen_ai.conversation.id).")
    user_id: str | None = Field(
        default=None, description="The request's user id; HMAC-SHA256 (hex) where the tenant's policy hashes them."
    )
    category: str | None = Field(default=None, description="The request's category (chat, quick_edit, ...).")
    tier: str | None = Field(default=None, description="Tier of the model the router chose; None if none was.")
    release: ReleaseContext | None = Field(
        default=None, description="The release it ran under: upgrade id, version, previous version, stage."
    )
    shadowed_by: list[str] | None = Field(
        default=None,
        description="The shadow experiments its request was mirrored to (RoutedRequest.shadowed_by): the "
        "shadow-comparator holds this result until their copies' results join it; [] none; None: not said.",
    )

    @property
    def request_key(self) -> RequestKey:
        return request_key(self.tenant, self.request_id)

    def gen_ai_attributes(self) -> dict[str, Any]:
        return gen_ai_object(
            model=self.model,
            input_tokens=self.usage.prompt_tokens,
            output_tokens=self.usage.completion_tokens,
            cached_input_tokens=self.usage.cached_prompt_tokens,
            finish_reason=self.finish_reason.value if self.finish_reason else None,
            session_id=self.session_id,
        )
