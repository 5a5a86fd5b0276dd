"""The worker's vLLM settings: validated where they are read, and each one reaches vLLM's engine args."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmbus_services.engine_worker.adapters.engines import vllm_inputs
from llmbus_services.engine_worker.adapters.engines.factory import build_engine
from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
from llmbus_services.engine_worker.config import WorkerSettings

FLEET_ENV = {
    "LLMBUS_WORKER_ENGINE": "vllm",
    "LLMBUS_WORKER_MODEL": "llama-70b",
    "LLMBUS_WORKER_VLLM_MODEL_PATH": "/models/llama-70b",
    "LLMBUS_WORKER_VLLM_TENSOR_PARALLEL_SIZE": "4",
    "LLMBUS_WORKER_VLLM_PIPELINE_PARALLEL_SIZE": "2",
    "LLMBUS_WORKER_VLLM_ENFORCE_EAGER": "false",
    "LLMBUS_WORKER_VLLM_SCHEDULING_POLICY": "priority",
    "LLMBUS_WORKER_VLLM_BLOCK_SIZE": "32",
    "LLMBUS_WORKER_VLLM_KV_OFFLOADING_GIB": "64",
    "LLMBUS_WORKER_VLLM_MAX_NUM_SEQS": "128",
    "LLMBUS_WORKER_VLLM_MAX_MODEL_LEN": "32768",
    "LLMBUS_WORKER_VLLM_MAX_NUM_BATCHED_TOKENS": "8192",
    "LLMBUS_WORKER_VLLM_GPU_MEMORY_UTILIZATION": "0.9",
    "LLMBUS_WORKER_VLLM_OTLP_TRACES_ENDPOINT": "http://otel-collector:4317",
    "LLMBUS_WORKER_VLLM_WARMUP_ITERATIONS": "3",
    "LLMBUS_WORKER_VLLM_WARMUP_PROMPT_TOKENS": "2048",
    "LLMBUS_WORKER_VLLM_TOOL_CALL_PARSER": "hermes",
}


def _engine(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> VllmEngine:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    engine = build_engine(WorkerSettings())
    assert isinstance(engine, VllmEngine)
    return engine


def test_every_fleet_setting_reaches_vllms_engine_args(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(monkeypatch, FLEET_ENV)
    args = engine._engine_args()
    assert args.model == "/models/llama-70b" and args.served_model_name == "llama-70b"
    assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (4, 2)
    assert args.enforce_eager is False
    assert args.scheduling_policy == "priority"
    assert args.block_size == 32
    assert args.kv_offloading_size == 64.0
    assert (args.max_num_seqs, args.max_model_len, args.max_num_batched_tokens) == (128, 32768, 8192)
    assert args.gpu_memory_utilization == 0.9
    assert args.otlp_traces_endpoint == "http://otel-collector:4317"
    assert (engine.config.warmup_iterations, engine.config.warmup_prompt_tokens) == (3, 2048)
    assert engine.config.tool_call_parser == "hermes"


def test_defaults_warm_up_5_x_1024_with_a_pool_of_080_vllms_window_and_batch_and_eager_only_on_the_cpu_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = _engine(monkeypatch, {"LLMBUS_WORKER_ENGINE": "vllm"})
    assert (engine.config.warmup_iterations, engine.config.warmup_prompt_tokens) == (5, 1024)
    args = engine._engine_args()
    assert args.gpu_memory_utilization == 0.80
    assert args.kv_offloading_size is None and args.scheduling_policy == "fcfs"
    assert args.tensor_parallel_size == 1 == args.pipeline_parallel_size

    assert (args.max_model_len, args.max_num_seqs) == (None, None)  # vLLM's own: the model's window, its batch

    from vllm.platforms import current_platform

    # Whichever build and hardware this host has: eager on the CPU build, CUDA graphs captured on a GPU.
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: True)
    assert engine._engine_args().enforce_eager is True
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    assert engine._engine_args().enforce_eager is False


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("LLMBUS_WORKER_VLLM_SCHEDULING_POLICY", "lottery"),
        ("LLMBUS_WORKER_VLLM_TENSOR_PARALLEL_SIZE", "0"),
        ("LLMBUS_WORKER_VLLM_GPU_MEMORY_UTILIZATION", "1.5"),
        ("LLMBUS_WORKER_VLLM_KV_OFFLOADING_GIB", "-1"),
        ("LLMBUS_WORKER_VLLM_WARMUP_ITERATIONS", "-1"),
        ("LLMBUS_WORKER_VLLM_BLOCK_SIZE", "0"),
    ],
)
def test_a_wrong_setting_is_refused_when_read(monkeypatch: pytest.MonkeyPatch, key: str, value: str) -> None:
    monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError):
        WorkerSettings()


class _Tokenizer:
    all_special_ids = [0, 1, 2]
    added_tokens_decoder = {2: "x", 9: "y"}

    def __len__(self) -> int:
        return 10


def test_the_warmup_plan_uses_ordinary_tokens_and_no_two_prompts_share_a_start() -> None:
    plan = vllm_inputs.warmup_plan(_Tokenizer(), iterations=5, prompt_tokens=1024, max_model_len=4096)
    assert len(plan) == 5 and all(len(p) == 1024 for p in plan)
    assert all(set(p) <= {3, 4, 5, 6, 7, 8} for p in plan)  # no special or added token
    assert len({tuple(p[:16]) for p in plan}) == 5  # 16: the smallest KV block
    # Capped so that the prompt and the warm-up's output fit the model.
    capped = vllm_inputs.warmup_plan(_Tokenizer(), iterations=2, prompt_tokens=1024, max_model_len=512)
    assert all(len(p) == 512 - vllm_inputs.WARMUP_OUTPUT_TOKENS for p in capped)
