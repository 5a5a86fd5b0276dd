"""The format choice applied to a worker's settings."""

from __future__ import annotations

import pytest

from llmbus.contract.messages import GpuInfo, ModelFormat, ModelSpec, NodeProfile
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.formats import NoFormatFits
from llmbus_services.engine_worker.core.node_plan import plan_for

GIB = 1024**3
SPEC = ModelSpec(
    name="llama-8b",
    max_model_len=8192,
    formats=[
        ModelFormat(name="bf16", weight_bytes=16 * GIB, path="/models/llama-8b"),
        ModelFormat(name="fp8", weight_bytes=8 * GIB, path="/models/llama-8b-fp8"),
        ModelFormat(name="awq", weight_bytes=5 * GIB, path="/models/llama-8b-awq"),
    ],
)


def node(cc: str, free_gib: float, ecc: int = 0) -> NodeProfile:
    gpu = GpuInfo(
        index=0,
        name="GPU",
        uuid="GPU-1",
        memory_total_bytes=int(80 * GIB),
        memory_free_bytes=int(free_gib * GIB),
        compute_capability=cc,
        ecc_uncorrected_volatile=ecc,
    )
    return NodeProfile(node_id="n1", hostname="h", kind="gpu", gpus=[gpu])


def settings() -> WorkerSettings:
    return WorkerSettings(engine="vllm", model="llama-8b", vllm_max_model_len=32768)


def test_big_hopper_runs_bf16_with_its_checkpoint() -> None:
    plan = plan_for(settings(), node("9.0", 70), SPEC)
    assert plan.model_format == "bf16"
    assert (plan.settings.vllm_dtype, plan.settings.vllm_quantization) == ("bfloat16", None)
    assert plan.settings.vllm_model_path == "/models/llama-8b"
    assert plan.settings.vllm_max_model_len == 8192, "capped by the model's window"
    assert "fp8" in plan.formats_supported


def test_small_ada_card_takes_fp8_and_old_card_takes_awq() -> None:
    assert plan_for(settings(), node("8.9", 12), SPEC).settings.vllm_quantization == "fp8"
    ampere = plan_for(settings(), node("8.6", 12), SPEC)  # fp8 needs 8.9
    assert ampere.model_format == "awq" and ampere.settings.vllm_model_path == "/models/llama-8b-awq"


def test_nothing_fits_is_a_clear_error() -> None:
    with pytest.raises(NoFormatFits, match="awq"):
        plan_for(settings(), node("8.6", 4), SPEC)


def test_cpu_node_and_ecc_health() -> None:
    cpu = NodeProfile(node_id="n1", hostname="h", kind="cpu")
    assert plan_for(settings(), cpu, SPEC).model_format is None
    sick = plan_for(settings(), node("9.0", 70, ecc=3), SPEC)
    assert not sick.gpu_healthy and sick.ecc_uncorrected == 3
