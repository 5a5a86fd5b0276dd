"""Engine-worker settings (env prefix LLMBUS_WORKER_)."""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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

    # vllm engine
    vllm_model_path: str = ""
    vllm_max_model_len: int = 2048
    vllm_max_num_seqs: int = 16
    vllm_dtype: str = "auto"
    vllm_quantization: str | None = None  # set by the format choice when a ModelSpec is known
    vllm_enforce_eager: bool = True
    vllm_gpu_memory_utilization: float = 0.85
    vllm_cpu_kvcache_space_gib: float | None = 1.0
    vllm_enable_prefix_caching: bool = True
    vllm_ignore_eos: bool = False

    # openai-http engine
    openai_base_url: str = "http://127.0.0.1:8000/v1"
    openai_api_key: str = ""
    openai_model: str = ""
    openai_upstreams_file: str = ""  # YAML of every upstream's settings (engines/OPENAI_HTTP.md); overrides the 3 above
