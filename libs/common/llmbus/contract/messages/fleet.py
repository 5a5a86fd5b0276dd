"""The fleet: workers, nodes, models, dispatch outcomes and control commands."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from llmbus.contract.messages.adapters import LoraAdapter
from llmbus.contract.messages.artifacts import ModelArtifact
from llmbus.contract.messages.base import Message, Part, now_ms
from llmbus.contract.messages.errors import ErrorInfo
from llmbus.contract.messages.registry import (
    HardwareRequirements,
    ModelLineage,
    ModelState,
    ReleasePlan,
    StateTransition,
)
from llmbus.contract.messages.release import ReleaseContext
from llmbus.contract.request_key import RequestKey, request_key


class WorkerState(StrEnum):
    STARTING = "starting"
    WARMING = "warming"
    READY = "ready"
    DEGRADED = "degraded"  # running, but its upstream fails (circuit open): the scheduler places nothing here
    DRAINING = "draining"
    UNHEALTHY = "unhealthy"
    STOPPED = "stopped"
    FAILED = "failed"  # its start failed (a bad artifact, no format fits): it never serves; state_reason says why

    @property
    def ended(self) -> bool:
        """The process is gone or going: stopped, or its start failed (it exits). No capacity, no more heartbeats."""
        return self in (WorkerState.STOPPED, WorkerState.FAILED)


class WorkerStatus(Message):
    """Heartbeat on llm.workers (compacted, key: worker id), about once a second.

    Gauge fields keep vLLM's metric stems where they mean the same thing
    (num_requests_running, num_requests_waiting, kv_cache_usage_perc, ...).
    """

    worker_id: str
    node_id: str
    state: WorkerState
    engine: str = Field(description="vllm | sim | onnx | openai-http")
    engine_features: list[str] | None = Field(
        default=None,
        description="what this worker's engine honours beyond text (response_format, tools, suffix);"
        " None: the engine kind's defaults (llmbus.contract.engine_features)",
    )
    models: list[str] = Field(default_factory=list)
    model_version: str | None = Field(
        default=None,
        description="The registry version it serves (ModelSpec.version on llm.models); the scheduler places a "
        "request routed to a version only on workers of that version",
    )
    model_format: str | None = None
    state_reason: str | None = Field(
        default=None,
        description="why the worker is in its state: while starting, what it is doing (fetching an artifact);"
        " failed, the error (its code first, e.g. 'artifact_digest_mismatch: model.safetensors: ...')",
    )
    dispatch_topic: str = ""
    max_model_len: int = 0
    max_num_seqs: int = 0
    kv_block_size: int = 16
    kv_blocks_total: int = 0
    kv_blocks_free: int = 0
    kv_offload_blocks_total: int = Field(default=0, description="blocks of a host-memory KV offloading tier; 0: none")
    kv_cache_usage_perc: float = Field(default=0.0, ge=0.0, le=1.0)
    num_requests_running: int = 0
    num_requests_waiting: int = 0
    prefill_backlog_tokens: int = Field(
        default=0,
        ge=0,
        description="prompt tokens the engine has admitted and not yet prefilled (waiting requests' prompts,"
        " the unfinished part of chunked prefills): the wait for a first token that queue wait does not see",
    )
    oldest_running_started_at_ms: int | None = Field(
        default=None,
        description="when the longest-running request now on the engine started (ms); None: none running",
    )
    prefix_cache_hit_rate: float = Field(
        default=0.0, ge=0.0, le=1.0, description="prompt tokens served from the GPU cache or the offloading tier"
    )
    generation_tokens_per_s: float = 0.0
    prompt_tokens_per_s: float = 0.0
    cold_start_s: float | None = None
    cold_start_phases_s: dict[str, float] = Field(
        default_factory=dict,
        description="cold start by phase name, seconds, in the order they ran: startup (process start to engine"
        " start: node profile, models table), fetch and verify (the model's artifact downloaded into the node's"
        " cache and its sha256 checked; near 0 on a cache hit), then engine_start, or for vllm import, config,"
        " engine_process (the engine-core process's start besides the next three), weights (loaded), kv_pool"
        " (memory profiled, KV cache allocated), kernels (torch.compile, CUDA graphs captured), then warmup"
        " (dummy inference); services/engine_worker/README.md lists them",
    )
    gpu_healthy: bool = True
    ecc_uncorrected: int = 0
    formats_supported: list[str] = Field(default_factory=list)
    max_loras: int = Field(
        default=0,
        ge=0,
        description="LoRA adapters the engine keeps loaded (vLLM's max_cpu_loras, at least its max_loras per batch);"
        " 0: it serves no adapter",
    )
    max_lora_rank: int = Field(default=0, ge=0, description="the largest adapter rank it loads (vLLM's max_lora_rank)")
    lora_adapters: list[str] = Field(
        default_factory=list,
        description="the adapters loaded in its slots now, least recently used first (a new one evicts the first)",
    )
    started_at_ms: int = Field(default_factory=now_ms)
    sent_at_ms: int = Field(default_factory=now_ms)


class GpuInfo(Part):
    index: int
    name: str
    uuid: str
    memory_total_bytes: int
    memory_free_bytes: int
    compute_capability: str
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    peak_tflops: float | None = Field(
        default=None, description="dense peak at its best 16-bit tensor precision (the GPU class's datasheet figure)"
    )


class NodeHealth(StrEnum):
    OK = "ok"
    DEGRADED = "degraded"  # corrected ECC errors over the agent's threshold: no high-priority work here
    UNHEALTHY = "unhealthy"  # uncorrected ECC errors over the threshold: no work here at all


class NodeProfile(Message):
    """Hardware of one node on llm.nodes (compacted, key: node id): from its node agent, else from a worker's probe."""

    node_id: str
    hostname: str
    kind: Literal["gpu", "cpu"]
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)
    cpu_model: str | None = None
    cpu_count: int = 0
    memory_total_bytes: int = 0
    memory_free_bytes: int = 0
    profiled_at_ms: int = Field(default_factory=now_ms)
    source: Literal["agent", "worker"] = Field(
        default="worker", description="agent: the node agent's (workers read it); worker: a worker probed it alone"
    )
    hardware_class: str | None = Field(
        default=None,
        description="what placement judges it by: h100, a100, a10, l4, t4, ... or cpu (llmbus.domain.hardware)",
    )
    peak_tflops: float | None = Field(default=None, description="the node's dense peak compute, all GPUs (or its CPUs)")
    health: NodeHealth = NodeHealth.OK
    health_reason: str = ""


class ModelFormat(Part):
    name: str = Field(description="bf16 | fp16 | fp8 | awq | gptq | onnx")
    weight_bytes: int = Field(ge=0)
    min_compute_capability: str | None = None
    path: str | None = Field(default=None, description="Checkpoint of this format (local dir or hub name).")


class ModelSpec(Message):
    """A model on llm.models (compacted): the model as served (key: name), or one version's registry record
    (key: `<name>@<version>`, `record: version`).

    Readers that route and place (router, scheduler, gateway) read the `serving` records; the registry
    (`llmbus models`, releases) keeps one `version` record per version, and writes the serving record
    from the version that serves. A serving record without `state` is a plain model outside the
    registry's lifecycle (`llmbus models register NAME`).
    """

    name: str
    version: str = "1"
    record: Literal["serving", "version"] = Field(
        default="serving",
        description="serving: the model as served now (key: name); version: one version's registry record "
        "(key: name@version). Readers that do not keep versions skip version records.",
    )
    tier: str | None = None
    max_model_len: int = 8192
    max_output_tokens: int = 4096
    max_prompt_tokens: int | None = None
    formats: list[ModelFormat] = Field(default_factory=list)
    kv_bytes_per_token: int | None = Field(
        default=None,
        ge=0,
        description="KV cache bytes one token takes, all layers, K and V (2 x layers x KV heads x head dim x bytes of"
        " the cache's dtype: 131072 for Llama-3.1-8B in bf16). The format choice keeps room for one max_model_len"
        " sequence of it, shared over the engine's GPUs. None: no room kept beyond the headroom.",
    )
    hosted: bool = False
    tokenizer: str | None = Field(
        default=None,
        description="The model's tokenizer as a local reference (llmbus.tokens: 'pkg:<package>/<file>', a "
        "tokenizer.json or a model directory); the router and scheduler count prompts with it. None: the "
        "per-script estimate.",
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        description="Streams one worker of the model runs at once (a hosted upstream's concurrency limit); "
        "workers that set none take it. None: the engine's default.",
    )
    # The registry (llmbus models register -f / push / release): all optional, a plain model has none.
    artifacts: list[ModelArtifact] = Field(
        default_factory=list, description="Where each format's files are, with the sha256 and size of every file."
    )
    chat_template: str | None = Field(default=None, description="Reference to the chat template (file or URI).")
    hardware: HardwareRequirements | None = None
    lineage: ModelLineage | None = None
    owner: str | None = None
    state: ModelState | None = Field(default=None, description="None: outside the registry's lifecycle")
    transitions: list[StateTransition] = Field(default_factory=list, description="Every state change, oldest first.")
    release: ReleaseContext | None = Field(
        default=None,
        description="The release that put this version in its state (on the serving record: that made it serve).",
    )
    release_plan: ReleasePlan | None = Field(default=None, description="Ramp and guardrails of its release.")
    registered_at_ms: int | None = None
    lora: LoraAdapter | None = Field(
        default=None,
        description="Set on a LoRA adapter's record: served by the workers of lora.base_model that load adapters"
        " (lora.name is this record's name).",
    )

    @property
    def key(self) -> str:
        """Its key on llm.models: the name for the serving record, `<name>@<version>` for a version's."""
        return f"{self.name}@{self.version}" if self.record == "version" else self.name

    @model_validator(mode="after")
    def _adapter_named_as_the_model(self) -> ModelSpec:
        if self.lora is not None and self.lora.name != self.name:
            raise ValueError(f"lora.name {self.lora.name!r} must be the model's name {self.name!r}")
        return self


class OutcomeStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"  # final failure: the worker published the final error result
    RETRYABLE = "retryable"  # the scheduler places it again (attempt + 1)
    DUPLICATE = "duplicate"  # a redelivered dispatch that was already done


class DispatchOutcome(Message):
    """engine-worker → scheduler on llm.outcomes (key: request id): one per dispatch attempt."""

    request_id: str
    tenant: str = Field(
        default="default",
        max_length=64,
        description="The request's tenant: with request_id, which request this is (two tenants may use one id).",
    )
    worker_id: str
    attempt: int
    status: OutcomeStatus
    error: ErrorInfo | None = None
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float | None = Field(
        default=None, description="received → first token, as the request's result reports it; None: no token"
    )
    tpot_ms: float | None = Field(default=None, description="mean time per output token after the first")
    finished_at_ms: int = Field(default_factory=now_ms)

    @property
    def request_key(self) -> RequestKey:
        return request_key(self.tenant, self.request_id)


class ControlAction(StrEnum):
    CANCEL = "cancel"
    DRAIN = "drain"


class Control(Message):
    """On llm.control (key: target id: the request's key `<tenant>:<request id>` for cancel, a worker id for drain)."""

    action: ControlAction
    target_id: str
    reason: str = ""
    sent_at_ms: int = Field(default_factory=now_ms)
