"""The format choice over the engine's GPUs (tensor x pipeline parallel), read from NVML profiles (a fake pynvml).

Llama-3.1-70B's formats at their checkpoint sizes; its KV cache in bf16 is 2 x 80 layers x 8 KV heads x 128
dims x 2 bytes = 327,680 bytes per token, 2.68 GB for one 8,192-token sequence.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmbus.contract.messages import ModelFormat, ModelSpec, NodeProfile
from llmbus.node.probe import profile_node
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.formats import NoFormatFits
from llmbus_services.engine_worker.core.node_plan import plan_for, visible_gpus
from tests.fixtures.fake_nvml import FakeGpu, make_fake_nvml

GB = 10**9
LLAMA_70B = ModelSpec(
    name="llama-3.1-70b-instruct",
    max_model_len=8192,
    kv_bytes_per_token=327_680,
    formats=[
        ModelFormat(name="bf16", weight_bytes=141_100_000_000, path="/models/70b"),
        ModelFormat(name="fp8", weight_bytes=70_600_000_000, path="/models/70b-fp8"),
        ModelFormat(name="awq", weight_bytes=39_800_000_000, path="/models/70b-awq"),
    ],
)


def a10(i: int, free_gb: float = 23.7) -> FakeGpu:
    return FakeGpu(
        name="NVIDIA A10", uuid=f"GPU-a10-{i}", total_bytes=24_146_608_128, free_bytes=int(free_gb * GB), cc=(8, 6)
    )


def h100(i: int, free_gb: float = 84.0) -> FakeGpu:
    return FakeGpu(uuid=f"GPU-h100-{i}", free_bytes=int(free_gb * GB))


def node(gpus: list[FakeGpu], tmp_path: Path) -> NodeProfile:
    return profile_node("n1", nvml=make_fake_nvml(gpus), proc_dir=tmp_path)


def tp(size: int, pp: int = 1) -> WorkerSettings:
    return WorkerSettings(
        engine="vllm", model=LLAMA_70B.name, vllm_tensor_parallel_size=size, vllm_pipeline_parallel_size=pp
    )


def test_four_a10s_run_70b_as_awq_a_quarter_each(tmp_path: Path) -> None:
    plan = plan_for(tp(4), node([a10(i) for i in range(4)], tmp_path), LLAMA_70B)
    # (39.8 GB of weights + 2.68 GB of KV) / 4 = 10.62 GB per GPU within 0.85 x 23.7 = 20.14 GB;
    # bf16 needs 35.94 GB per GPU, and an A10 (8.6) has no fp8 kernels.
    assert plan.model_format == "awq" and plan.settings.vllm_model_path == "/models/70b-awq"
    assert plan.settings.vllm_quantization == "awq" and plan.settings.vllm_max_model_len == 8192
    assert "10.62 GB per GPU (39.80 GB of weights + 2.68 GB of KV cache over 4 GPUs)" in plan.reason
    assert "GPUs [0, 1, 2, 3]" in plan.reason


def test_one_a10_alone_cannot_hold_70b(tmp_path: Path) -> None:
    with pytest.raises(NoFormatFits, match=r"awq: needs 39.80 GB of weights \+ 2.68 GB of KV cache, 20.14 GB usable"):
        plan_for(tp(1), node([a10(i) for i in range(4)], tmp_path), LLAMA_70B)


def test_the_gpu_with_the_least_free_memory_decides(tmp_path: Path) -> None:
    # 0.85 x 12.5 = 10.63 GB usable on the fullest GPU: the 10.62 GB share still fits ...
    fits = plan_for(tp(4), node([a10(0), a10(1), a10(2, free_gb=12.5), a10(3)], tmp_path), LLAMA_70B)
    assert fits.model_format == "awq" and "12.50 GB free (the least free of the group)" in fits.reason
    # ... 0.85 x 12.4 = 10.54 GB does not, though three GPUs have 23.7 GB free.
    with pytest.raises(NoFormatFits, match=r"4 GPUs, compute capability 8.6, 10.54 GB usable"):
        plan_for(tp(4), node([a10(0), a10(1), a10(2, free_gb=12.4), a10(3)], tmp_path), LLAMA_70B)


def test_more_gpus_buy_a_better_format(tmp_path: Path) -> None:
    eight = node([h100(i) for i in range(8)], tmp_path)
    # 0.85 x 84 GB = 71.4 GB usable per GPU; one 8,192-token sequence's KV is 2.68 GB over the group.
    assert plan_for(tp(1), eight, LLAMA_70B).model_format == "awq"  # fp8: 73.28 GB on one GPU does not fit
    assert plan_for(tp(2), eight, LLAMA_70B).model_format == "fp8"  # 36.64 GB each; bf16's 71.89 GB does not
    assert plan_for(tp(4), eight, LLAMA_70B).model_format == "bf16"  # 35.94 GB each
    assert plan_for(tp(2, pp=2), eight, LLAMA_70B).model_format == "bf16"  # pipeline stages split it too


def test_the_lowest_compute_capability_of_the_group_decides(tmp_path: Path) -> None:
    mixed = node([h100(0), h100(1), FakeGpu(uuid="GPU-a100", cc=(8, 0), free_bytes=80 * GB), h100(3)], tmp_path)
    plan = plan_for(tp(4), mixed, LLAMA_70B)
    assert plan.model_format == "bf16"  # 35.94 GB per GPU: fits; fp8 would not run on the A100 anyway
    assert plan.formats_supported == ["bf16", "fp16", "awq", "gptq"]
    assert "compute capability 8.0" in plan.reason
    assert plan_for(tp(2), mixed, LLAMA_70B).formats_supported[2] == "fp8"  # GPUs 0 and 1 only


def test_cuda_visible_devices_picks_the_engines_gpus(tmp_path: Path) -> None:
    # GPU 0 and 1 are busy with another engine: this worker was given 2 and 3.
    profile = node([h100(0, free_gb=5), h100(1, free_gb=5), h100(2), h100(3)], tmp_path)
    with pytest.raises(NoFormatFits):
        plan_for(tp(2), profile, LLAMA_70B)
    assert plan_for(tp(2), profile, LLAMA_70B, "2,3").model_format == "fp8"
    assert plan_for(tp(2), profile, LLAMA_70B, "GPU-h100-3,GPU-h100-2").model_format == "fp8"
    assert [g.index for g in visible_gpus(profile, "3,2")[0]] == [3, 2]
    assert [g.index for g in visible_gpus(profile, "2,7,3")[0]] == [2]  # CUDA stops at an unknown entry
    assert [g.index for g in visible_gpus(profile, "MIG-abc")[0]] == [0, 1, 2, 3]  # not in NVML's list


def test_too_few_gpus_for_the_parallelism_is_a_clear_error(tmp_path: Path) -> None:
    profile = node([h100(i) for i in range(4)], tmp_path)
    with pytest.raises(
        NoFormatFits, match=r"tensor_parallel_size 4 x pipeline_parallel_size 2 needs 8 GPUs; the node's"
    ):
        plan_for(tp(4, pp=2), profile, LLAMA_70B)
    with pytest.raises(NoFormatFits, match=r"needs 4 GPUs; CUDA_VISIBLE_DEVICES=0,1 shows 2"):
        plan_for(tp(4), profile, LLAMA_70B, "0,1")


def test_an_unset_window_is_the_registrys_and_an_unknown_model_keeps_vllms(tmp_path: Path) -> None:
    profile = node([h100(0)], tmp_path)
    settings = WorkerSettings(engine="vllm", model="llama-3.1-8b-instruct")
    spec = ModelSpec(
        name="llama-3.1-8b-instruct", max_model_len=16384, formats=[ModelFormat(name="bf16", weight_bytes=16 * GB)]
    )
    assert settings.vllm_max_model_len is None and settings.vllm_max_num_seqs is None
    planned = plan_for(settings, profile, spec).settings
    assert planned.vllm_max_model_len == 16384 and planned.vllm_max_num_seqs is None
    assert plan_for(settings, profile, None).settings.vllm_max_model_len is None
