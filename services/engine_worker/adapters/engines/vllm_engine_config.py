"""The `vllm` engine's settings: what reaches vLLM's engine arguments, and the worker's own around them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class VllmConfig:
    model: str  # the name the fleet knows it by (ModelSpec.name)
    model_path: str = ""  # a local directory or a hub name already in the local cache; default: `model`
    dtype: str = "auto"  # "float32" for the CPU tiny model, "bfloat16" / "float16" on GPU
    quantization: str | None = None  # "fp8" | "awq" | "gptq" (the format choice, core/formats.py)
    # None: vLLM's (the model's own window; vLLM's batch size for the platform and GPU). The CPU tests set theirs.
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    # True: no CUDA graphs / compile (faster cold start, what the CPU build needs). None: eager on
    # the CPU build, CUDA graphs captured on GPU (decode steps without per-kernel launch cost).
    enforce_eager: bool | None = None
    gpu_memory_utilization: float = 0.80  # the memory pool: weights + activations + KV cache
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    kv_offloading_gib: float | None = None  # host-memory KV tier (vLLM's kv_offloading_size); None: none
    kv_cache_memory_bytes: int | None = None
    cpu_kvcache_space_gib: float | None = None  # sets VLLM_CPU_KVCACHE_SPACE (CPU build only); None: env as is
    enable_prefix_caching: bool = True
    block_size: int | None = None  # None: the platform's default (16 on GPU, 128 on CPU)
    scheduling_policy: str = "fcfs"  # "priority" makes EngineRequest.priority count (0 = first)
    seed: int = 0
    ignore_eos: bool = False  # benchmarks want fixed-length outputs, like `vllm bench --ignore-eos`
    otlp_traces_endpoint: str | None = None  # without it vLLM drops the trace headers
    # vLLM's --tool-call-parser (e.g. "hermes" for Qwen2.5): tool_choice "auto" parses calls out of the
    # model's text, "required" makes it write one in its own format. None: "auto" answers text.
    tool_call_parser: str | None = None
    # The model's fill-in-the-middle format: a name of core/fim.py's FIM_FORMATS ("qwen2.5-coder", ...)
    # or a template with {prefix} and {suffix}. None: vLLM's renderer's, if the model's has one.
    fim_format: str | None = None
    # LoRA adapters (vLLM's enable_lora when max_loras > 0): slots in one batch, the largest rank, adapters kept
    # in host memory (vLLM's max_cpu_loras; None: max_loras). A new adapter evicts the least recently used.
    max_loras: int = 0
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    warmup_iterations: int = 5  # before ready: this many dummy prompts, one after the other ...
    warmup_prompt_tokens: int = 1024  # ... of this many tokens (capped to max_model_len)
    # How the engine-core process starts. None: vLLM's choice (the CPU build forces "spawn", which
    # imports torch and vLLM again in the child: ~20 CPU-seconds per start). "fork" reuses this
    # process's imports; the test suite uses it with one OpenMP thread (libgomp is not fork-safe
    # once it has a thread pool).
    engine_core_start_method: Literal["fork", "spawn"] | None = None
    # Start on a vLLM release other than the tested one (vllm_version.py), with a warning instead of an error.
    allow_untested_version: bool = False
    extra_engine_args: dict[str, Any] = field(default_factory=dict)
