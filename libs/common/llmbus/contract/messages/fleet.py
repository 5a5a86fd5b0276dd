"""The fleet: workers, nodes, models, dispatch outcomes and control commands."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from llmbus.contract.messages.base import Message, Part, now_ms
from llmbus.contract.messages.errors import ErrorInfo
from llmbus.contract.request_key import RequestKey, request_key


class WorkerState(StrEnum):
    STARTING = "starting"
    WARMING = "warming"
    READY = "ready"
    DEGRADED = "degraded"  # running, but its upstream fails (circuit open): the scheduler places nothing here
    DRAINING = "draining"
    UNHEALTHY = "unhealthy"
    STOPPED = "stopped"


class WorkerStatus(Message):
    """Heartbeat on llm.workers (compacted, key: worker id), about once a second.

    Gauge fields keep vLLM's metric stems where they mean the same thing
    (num_requests_running, num_requests_waiting, kv_cache_usage_perc, ...).
    """

    worker_id: str
    node_id: str
    state: WorkerState
    engine: str = Field(description="vllm | sim | openai-http")
    engine_features: list[str] | None = Field(
        default=None,
        description="what this worker's engine honours beyond text (response_format, tools, suffix);"
        " None: the engine kind's defaults (llmbus.contract.engine_features)",
    )
    models: list[str] = Field(default_factory=list)
    model_version: str | None = None
    model_format: str | None = None
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
        description="cold start by phase, seconds: startup (process start to engine start: node profile, models"
        " table), engine_start, or for vllm import, config and engine_core (weights loaded, KV cache profiled and"
        " allocated, CUDA graphs captured), then warmup",
    )
    gpu_healthy: bool = True
    ecc_uncorrected: int = 0
    formats_supported: list[str] = Field(default_factory=list)
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


class NodeProfile(Message):
    """Hardware of one node on llm.nodes (compacted, key: node id)."""

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


class ModelFormat(Part):
    name: str = Field(description="bf16 | fp16 | fp8 | awq | gptq")
    weight_bytes: int = Field(ge=0)
    min_compute_capability: str | None = None
    path: str | None = Field(default=None, description="Checkpoint of this format (local dir or hub name).")


class ModelSpec(Message):
    """A servable model on llm.models (compacted, key: model name)."""

    name: str
    version: str = "1"
    tier: str | None = None
    max_model_len: int = 8192
    max_output_tokens: int = 4096
    max_prompt_tokens: int | None = None
    formats: list[ModelFormat] = Field(default_factory=list)
    hosted: bool = False
    tokenizer: str | None = Field(
        default=None,
        description="The model's tokenizer as a local reference (llmbus.tokens: 'pkg:<package>/<file>', a "
        "tokenizer.json or a model directory); the router and scheduler count prompts with it. None: the "
        "per-script estimate.",
    )


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
