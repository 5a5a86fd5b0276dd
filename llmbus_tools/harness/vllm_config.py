"""The tiny random-weight Llama's vLLM engine settings, shared by the tests' session engines and the benchmarks."""

from __future__ import annotations

import os

from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmConfig
from llmbus_tools.harness.tiny_llama import build_tiny_llama

TINY_MAX_MODEL_LEN = 512
# On a GPU each test engine (a session's two, a worker process) takes this share of the device's memory, so they
# fit on one GPU side by side; the CPU build ignores it. LLMBUS_TEST_GPU_MEMORY_UTILIZATION changes it.
TEST_GPU_MEMORY_UTILIZATION = float(os.environ.get("LLMBUS_TEST_GPU_MEMORY_UTILIZATION", "0.2"))


def tiny_vllm_config(**overrides: object) -> VllmConfig:
    values: dict[str, object] = {
        "model": "tiny-llama",
        "model_path": str(build_tiny_llama()),
        "dtype": "float32",
        "max_model_len": TINY_MAX_MODEL_LEN,
        "max_num_seqs": 8,
        "enforce_eager": True,
        "cpu_kvcache_space_gib": 1.0,  # 4096 blocks of 128 tokens for this model: plenty, little RAM
        "ignore_eos": True,  # random weights may emit EOS at any step; tests want exact lengths
        "warmup_iterations": 2,  # the plan's shape (iterations x dummy tokens), small on 2 cores
        "warmup_prompt_tokens": 256,
        "engine_core_start_method": "fork",  # see FAST_VLLM_ENV
        "gpu_memory_utilization": TEST_GPU_MEMORY_UTILIZATION,
    }
    values.update(overrides)
    return VllmConfig(**values)  # type: ignore[arg-type]


# How the tests run the CPU build (also the engine-worker process's env in test_worker_vllm). Measured
# per engine start on 2 cores (CPU-seconds, tiny model):
# - The CPU build runs the model in a third process (its multiprocess executor, spawned: torch and
#   vLLM imported a third time, ~21 CPU-s); VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps it in the engine
#   core (AsyncLLM still runs the engine core in a child of its own).
# - One OpenMP thread: with two on this shared machine each decode step waited for both threads
#   (400 tokens: 34.6 CPU-s with two, 4.2 with one), and libgomp is fork-safe only without a pool.
# - The engine core is forked (engine_core_start_method), not spawned: it inherits the imports.
FAST_VLLM_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
}

# An engine-worker process of the tiny model (its files fetched from a store, or its path given besides) as the
# tests run one: the model's window, a small batch, one short warm-up, the engine core forked, FAST_VLLM_ENV.
TINY_WORKER_ENV = {
    "LLMBUS_WORKER_VLLM_DTYPE": "float32",
    "LLMBUS_WORKER_VLLM_MAX_MODEL_LEN": str(TINY_MAX_MODEL_LEN),
    "LLMBUS_WORKER_VLLM_MAX_NUM_SEQS": "4",
    "LLMBUS_WORKER_VLLM_IGNORE_EOS": "true",
    "LLMBUS_WORKER_VLLM_WARMUP_ITERATIONS": "1",
    "LLMBUS_WORKER_VLLM_WARMUP_PROMPT_TOKENS": "64",
    "LLMBUS_WORKER_VLLM_ENGINE_CORE_START_METHOD": "fork",
    **FAST_VLLM_ENV,
}
