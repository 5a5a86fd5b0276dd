"""The request path: InferenceRequest → RoutedRequest → Dispatch → TokenChunk / InferenceResult."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, Literal, TypedDict

from pydantic import Field, field_validator, model_validator

from llmbus.contract.messages.base import Message, Part, new_request_id, now_ms
from llmbus.contract.messages.errors import ErrorInfo
from llmbus.contract.messages.genai import WithGenAi, gen_ai_object
from llmbus.contract.request_key import RequestKey, request_key

DEFAULT_REPLY_TOPIC = "llm.tokens"
# The model name that means "the router's policy chooses", on the bus as at the gateway.
AUTO_MODEL = "auto"


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


class ChatMessage(Part):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(default="", max_length=2_000_000)
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[ToolCall] | None = Field(
        default=None, max_length=128, description="An assistant message's tool calls (OpenAI's shape)."
    )
    tool_call_id: str | None = Field(default=None, max_length=256, description="A tool message: the call it answers.")

    def rendered(self) -> str:
        """The turn in the plain-text rendering (prompt_text): role-tagged, an assistant's tool calls
        as `name(arguments)` lines, so that they are counted and a completions API sees them."""
        calls = "".join(f"{c.function.name}({c.function.arguments})\n" for c in self.tool_calls or ())
        return f"<|{self.role}|>\n{self.content}\n{calls}"


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


class InferenceRequest(Message):
    """What a client produces onto llm.requests (key: session id, else request id)."""

    STRICT_INPUT: ClassVar[bool] = True  # client input: an unknown field is refused

    request_id: str = Field(default_factory=new_request_id, min_length=1, max_length=128)
    tenant: str = Field(default="default", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    user_id: str | None = Field(default=None, max_length=256)
    session_id: str | None = Field(default=None, max_length=256)
    model: str | None = Field(
        default=None, max_length=256, description=f"Explicit model; None or {AUTO_MODEL!r} lets the router choose."
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
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
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

    @property
    def request_key(self) -> RequestKey:
        """The key of state kept for this request: its tenant and request id together."""
        return request_key(self.tenant, self.request_id)

    @field_validator("model")
    @classmethod
    def _auto_is_no_model(cls, model: str | None) -> str | None:
        return None if model == AUTO_MODEL else model

    @model_validator(mode="after")
    def _has_input(self) -> InferenceRequest:
        if not self.messages and self.prompt is None:
            raise ValueError("a request needs `messages` or `prompt`")
        if self.suffix is not None and self.prompt is None:
            raise ValueError("`suffix` needs a plain `prompt` (fill-in-the-middle)")
        return self

    def engine_features(self) -> set[str]:
        """What an engine must support to answer this request as asked."""
        needed = set()
        if self.response_format is not None and self.response_format.constrains:
            needed.add("response_format")
        if self.tools:
            needed.add("tools")
        if self.suffix is not None:
            needed.add("suffix")
        return needed

    def prompt_text(self) -> str:
        """The text the engine sees: a plain prompt, or the chat rendered as role-tagged turns."""
        if self.prompt is not None:
            return self.prompt
        return "".join(m.rendered() for m in self.messages) + "<|assistant|>\n"

    @property
    def deterministic(self) -> bool:
        return self.temperature == 0.0 or self.seed is not None


class RequestFacts(TypedDict):
    """The request's facts on its result (and so on its cost record): InferenceResult's fields of these names."""

    session_id: str | None
    user_id: str | None
    category: str | None
    tier: str | None
    route_reason: str | None


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

    @property
    def request_id(self) -> str:
        return self.request.request_id

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
        )


class Dispatch(Message):
    """scheduler → one engine-worker on llm.dispatch.<worker_id> (key: request id)."""

    routed: RoutedRequest
    worker_id: str
    attempt: int = Field(default=1, ge=1)
    dispatched_at_ms: int = Field(default_factory=now_ms)
    prefix_block_hashes: list[str] = Field(default_factory=list)

    @property
    def request_id(self) -> str:
        return self.routed.request.request_id

    @property
    def request_key(self) -> RequestKey:
        return self.routed.request.request_key

    @property
    def dedupe_key(self) -> str:
        return f"{self.request_key}:{self.attempt}"


class Usage(Part):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"
    TOOL_CALLS = "tool_calls"  # the answer is tool calls for the client to run
    CONTENT_FILTER = "content_filter"  # a hosted upstream's filter cut the answer


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

    @property
    def request_key(self) -> RequestKey:
        return request_key(self.tenant, self.request_id)


class Timings(Part):
    """Milliseconds, measured by the services on the path."""

    received_at_ms: int | None = None
    queued_ms: float | None = Field(default=None, description="Received → engine started the request.")
    ttft_ms: float | None = Field(default=None, description="Received → first token.")
    total_ms: float | None = Field(default=None, description="Received → final token.")
    engine_ms: float | None = Field(default=None, description="Engine start → final token.")
    tpot_ms: float | None = Field(default=None, description="Mean time per output token after the first.")


class ResultStatus(StrEnum):
    OK = "ok"
    ERROR = "error"


class InferenceResult(WithGenAi):
    """Exactly one per request id on llm.results (key: request id)."""

    request_id: str
    tenant: str
    status: ResultStatus
    error: ErrorInfo | None = None
    model: str | None = None
    worker_id: str | None = None
    text: str = ""
    tool_calls: list[ToolCall] | None = Field(default=None, description="The answer's tool calls, assembled.")
    finish_reason: FinishReason | None = None
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
    # Facts of the request (RoutedRequest.facts), so results are analysed alone, without llm.requests.
    session_id: str | None = Field(default=None, description="The request's session id (gen_ai.conversation.id).")
    user_id: str | None = Field(
        default=None, description="The request's user id; HMAC-SHA256 (hex) where the tenant's policy hashes them."
    )
    category: str | None = Field(default=None, description="The request's category (chat, quick_edit, ...).")
    tier: str | None = Field(default=None, description="Tier of the model the router chose; None if none was.")

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
