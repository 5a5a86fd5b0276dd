"""Engine-worker settings (env prefix LLMBUS_WORKER_)."""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from llmbus.contract.messages import DEFAULT_MIGRATION_LIMIT
from llmbus_services.engine_worker.core.fim import parse_fim_template


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_WORKER_", extra="ignore")

    # Stable across restarts: the worker resumes its own dispatch topic from committed offsets.
    worker_id: str = Field(default_factory=lambda: f"worker-{socket.gethostname()}-{os.getpid()}")
    node_id: str = Field(default_factory=socket.gethostname)
    engine: Literal["sim", "vllm", "onnx", "openai-http"] = "sim"
    model: str = "sim-llama-8b"
    # The registry version served; None: the model's serving version on llm.models ("1" outside the registry).
    model_version: str | None = None
    # What to fetch before loading (services/engine_worker/README.md, "Fetching the model"); neither: the
    # model is on local disk already (vllm_model_path). model_ref, NAME@VERSION: the version's artifacts
    # from the registry (llm.models); it sets `model` and `model_version`. artifacts: given directly, as a
    # ModelArtifact (or a list of them) in JSON, or the URI of an artifact's root (s3://bucket/prefix/ or
    # file:///dir/, where `llmbus.artifacts.push_directory` wrote its manifest).
    model_ref: str | None = None
    artifacts: str | None = None
    max_in_flight: int = 256
    heartbeat_interval_s: float = 1.0
    node_profile_interval_s: float = 60.0
    # The node agent's profile of this node (llm.nodes) is used while it is this fresh; older, or none: the
    # worker probes NVML itself and publishes its own profile.
    node_agent_max_age_s: float = Field(default=60.0, gt=0.0)
    chunk_interval_ms: float = 20.0  # token chunks are flushed this often ...
    chunk_max_tokens: int = 16  # ... or when this many tokens are waiting
    superseded_check_s: float = 1.0  # while generating, how often to ask whether a later attempt took over
    drain_grace_s: float = 20.0  # SIGTERM: finish in-flight work this long, then hand it back
    # Draining (SIGTERM, scale-down, Control(drain)): answers that can be continued are handed over mid-stream
    # after this long (their next leg continues them elsewhere); the others keep drain_grace_s to finish.
    handover_grace_s: float = Field(default=2.0, ge=0.0)
    # A cut answer's legs at most, for a request that does not say (InferenceRequest.migration_limit).
    migration_limit: int = Field(default=DEFAULT_MIGRATION_LIMIT, ge=1, le=16)
    # Reading a cut answer back from its reply topic: from the request's receipt less this margin for the
    # clocks of router and workers (a first chunk found missing is read again from a minute before).
    continuation_margin_ms: int = Field(default=5_000, ge=0)
    continuation_read_timeout_s: float = Field(default=10.0, gt=0.0)
    # The served model's tokenizer (a llmbus.tokens reference: "pkg:<package>/<file>", a local
    # tokenizer.json / directory), for the sim's and openai-http's counts; vllm counts with its own.
    # None: the model's catalog entry's (its ModelSpec), else the one the router counted with.
    tokenizer: str | None = None

    # sim engine
    sim_profile: str = "llama-3.1-8b-h100"
    sim_speedup: float = 1.0  # 0: take no time
    sim_max_model_len: int | None = Field(default=None, ge=16)  # None: the model's catalog entry's, else 8192
    sim_max_num_seqs: int | None = Field(default=None, ge=1)  # None: the catalog entry's, else 256 (vLLM's)
    sim_kv_blocks_total: int | None = None  # GPU KV blocks; None: the profile's (one GPU's HBM)
    sim_kv_offloading_gib: float = 0.0  # host-memory KV tier (vLLM's --kv-offloading-size); 0: none
    sim_divergence: float = Field(default=0.0, ge=0.0, le=1.0)  # answer quality knob (shadow/A-B experiments)
    sim_max_loras: int = Field(default=0, ge=0)  # LoRA adapter slots (0: none), as vllm_max_loras
    sim_max_lora_rank: int = Field(default=16, ge=1)
    sim_lora_load_ms: float = Field(default=50.0, ge=0.0)  # loading an adapter, at sim_speedup
    # Without max_tokens, where an answer ends on its own: a length drawn around this median ("stop").
    sim_natural_answer_median_tokens: int = Field(default=129, ge=1)
    # temperature > 0 without a seed: a fresh answer every run, as a model samples (False: the same for the prompt)
    sim_sample_unseeded: bool = False

    # vllm engine (services/engine_worker/README.md lists what each reaches in vLLM's engine args)
    vllm_model_path: str = ""
    # Unset: vLLM's defaults (the model's own window, vLLM's batch size for the GPU); with a registered model
    # that lists formats, the window is capped to the registry's (ModelSpec.max_model_len, core/node_plan.py).
    vllm_max_model_len: int | None = Field(default=None, ge=16)
    vllm_max_num_seqs: int | None = Field(default=None, ge=1)
    vllm_dtype: str = "auto"
    vllm_quantization: str | None = None  # set by the format choice when a ModelSpec is known
    vllm_enforce_eager: bool | None = None  # None: eager on the CPU build, CUDA graphs on GPU
    vllm_gpu_memory_utilization: float = Field(default=0.80, gt=0.0, le=1.0)  # the memory pool's share of VRAM
    vllm_cpu_kvcache_space_gib: float | None = Field(default=1.0, gt=0.0)
    vllm_enable_prefix_caching: bool = True
    vllm_ignore_eos: bool = False
    vllm_tensor_parallel_size: int = Field(default=1, ge=1)
    vllm_pipeline_parallel_size: int = Field(default=1, ge=1)
    vllm_scheduling_policy: Literal["fcfs", "priority"] = "fcfs"  # priority: the request's priority, 0 first
    vllm_block_size: int | None = Field(default=None, ge=1)  # None: the platform's (16 on GPU, 128 on CPU)
    vllm_max_num_batched_tokens: int | None = Field(default=None, ge=1)
    vllm_kv_offloading_gib: float | None = Field(default=None, gt=0.0)  # host-memory KV tier; None: none
    vllm_otlp_traces_endpoint: str | None = None  # vLLM's own spans join the request's trace there
    vllm_tool_call_parser: str | None = None  # vLLM's --tool-call-parser ("hermes" for Qwen2.5): auto/required calls
    # The model's fill-in-the-middle format (`suffix`): a known name (qwen2.5-coder, starcoder2, codellama,
    # codestral) or a template with {prefix} and {suffix}; None: vLLM's renderer's, if the model has one
    vllm_fim_format: str | None = None
    # LoRA adapters: slots (vLLM's max_loras; 0: no adapters), their largest rank, adapters kept in host memory
    vllm_max_loras: int = Field(default=0, ge=0)
    vllm_max_lora_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = 16  # the ranks vLLM accepts
    vllm_max_cpu_loras: int | None = Field(default=None, ge=1)
    vllm_warmup_iterations: int = Field(default=5, ge=0)
    vllm_warmup_prompt_tokens: int = Field(default=1024, ge=1)
    vllm_engine_core_start_method: Literal["fork", "spawn"] | None = None  # None: vLLM's (spawn on the CPU build)
    # Start on a vLLM release other than the tested one (adapters/engines/vllm_version.py), with a warning
    vllm_allow_untested_version: bool = False

    # onnx engine (ONNX Runtime on a CPU node): an onnxruntime-genai model directory, its window and batch
    onnx_model_path: str = ""
    onnx_max_model_len: int | None = Field(default=None, ge=16)  # None: the model's context_length
    onnx_max_num_seqs: int = Field(default=4, ge=1)
    onnx_ignore_eos: bool = False

    # openai-http engine
    openai_base_url: str = "http://127.0.0.1:8000/v1"
    openai_api_key: str = ""
    openai_model: str = ""
    openai_max_model_len: int | None = Field(default=None, ge=16)  # None: the model's catalog entry's, else 8192
    openai_max_num_seqs: int | None = Field(default=None, ge=1)  # None: the catalog entry's, else 64
    openai_max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    openai_developer_role: bool = False  # send `developer` turns as they are (else as `system`)
    openai_prompt_cache: Literal["shared", "salted"] = "shared"  # salted: the upstream takes a cache_salt (vllm serve)
    # YAML of every upstream's settings (adapters/engines/OPENAI_HTTP.md); overrides the 3 above
    openai_upstreams_file: str = ""

    @model_validator(mode="after")
    def _model_from_ref(self) -> WorkerSettings:
        if self.model_ref is not None:
            name, at, version = self.model_ref.partition("@")
            if not (name and at and version):
                raise ValueError(f"model_ref {self.model_ref!r}: expected NAME@VERSION")
            self.model, self.model_version = name, version
        return self

    @field_validator("vllm_fim_format")
    @classmethod
    def _known_fim_format(cls, setting: str | None) -> str | None:
        if setting is not None:
            parse_fim_template(setting)  # a wrong name or template fails at start, not per request
        return setting
