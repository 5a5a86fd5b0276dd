"""Engine-worker settings (env prefix LLMBUS_WORKER_)."""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from llmbus_services.engine_worker.core.fim import parse_fim_template


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_WORKER_", extra="ignore")

    # Stable across restarts: the worker resumes its own dispatch topic from committed offsets.
    worker_id: str = Field(default_factory=lambda: f"worker-{socket.gethostname()}-{os.getpid()}")
    node_id: str = Field(default_factory=socket.gethostname)
    engine: Literal["sim", "vllm", "openai-http"] = "sim"
    model: str = "sim-llama-8b"
    model_version: str = "1"
    max_in_flight: int = 256
    heartbeat_interval_s: float = 1.0
    node_profile_interval_s: float = 60.0
    chunk_interval_ms: float = 20.0  # token chunks are flushed this often ...
    chunk_max_tokens: int = 16  # ... or when this many tokens are waiting
    superseded_check_s: float = 1.0  # while generating, how often to ask whether a later attempt took over
    drain_grace_s: float = 20.0  # SIGTERM: finish in-flight work this long, then hand it back
    # The served model's tokenizer (a llmbus.tokens reference: "pkg:<package>/<file>", a local
    # tokenizer.json / directory), for the sim's and openai-http's counts; vllm counts with its own.
    tokenizer: str | None = None

    # sim engine
    sim_profile: str = "llama-3.1-8b-h100"
    sim_speedup: float = 1.0  # 0: take no time
    sim_max_model_len: int = 8192
    sim_max_num_seqs: int = 256  # vLLM's default
    sim_kv_blocks_total: int | None = None  # GPU KV blocks; None: the profile's (one GPU's HBM)
    sim_kv_offloading_gib: float = 0.0  # host-memory KV tier (vLLM's --kv-offloading-size); 0: none
    sim_divergence: float = Field(default=0.0, ge=0.0, le=1.0)  # answer quality knob (shadow/A-B experiments)

    # vllm engine (services/engine_worker/README.md lists what each reaches in vLLM's engine args)
    vllm_model_path: str = ""
    vllm_max_model_len: int = Field(default=2048, ge=16)
    vllm_max_num_seqs: int = Field(default=16, ge=1)
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
    vllm_warmup_iterations: int = Field(default=5, ge=0)
    vllm_warmup_prompt_tokens: int = Field(default=1024, ge=1)
    vllm_engine_core_start_method: Literal["fork", "spawn"] | None = None  # None: vLLM's (spawn on the CPU build)

    # openai-http engine
    openai_base_url: str = "http://127.0.0.1:8000/v1"
    openai_api_key: str = ""
    openai_model: str = ""
    # YAML of every upstream's settings (adapters/engines/OPENAI_HTTP.md); overrides the 3 above
    openai_upstreams_file: str = ""

    @field_validator("vllm_fim_format")
    @classmethod
    def _known_fim_format(cls, setting: str | None) -> str | None:
        if setting is not None:
            parse_fim_template(setting)  # a wrong name or template fails at start, not per request
        return setting
