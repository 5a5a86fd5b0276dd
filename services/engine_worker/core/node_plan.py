"""What this node runs the model as (pure): the format choice applied to the worker's settings."""

from __future__ import annotations

from dataclasses import dataclass

from llmbus.contract.messages import ModelSpec, NodeProfile
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.formats import choose_format, supported_formats

QUANTIZED = {"fp8", "awq", "gptq"}
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def gpu_healthy(profile: NodeProfile, max_uncorrected_volatile: int = 0) -> bool:
    """False once any GPU has more uncorrected (double-bit) ECC errors since driver load than allowed."""
    return all((g.ecc_uncorrected_volatile or 0) <= max_uncorrected_volatile for g in profile.gpus)


@dataclass(frozen=True)
class NodePlan:
    settings: WorkerSettings  # with the chosen format applied
    model_format: str | None
    formats_supported: list[str]
    gpu_healthy: bool
    ecc_uncorrected: int
    reason: str


def plan_for(settings: WorkerSettings, profile: NodeProfile, spec: ModelSpec | None) -> NodePlan:
    """Choose the format on a GPU node when the model lists formats; raises NoFormatFits if none fits."""
    ecc = sum(g.ecc_uncorrected_volatile or 0 for g in profile.gpus)
    healthy = gpu_healthy(profile)
    if not profile.gpus:
        return NodePlan(settings, None, [], healthy, ecc, "CPU node: the engine's own dtype")
    gpu = profile.gpus[0]
    supported = supported_formats(gpu.compute_capability)
    if settings.engine != "vllm" or spec is None or not spec.formats:
        return NodePlan(settings, None, supported, healthy, ecc, "no formats listed for the model")
    choice = choose_format(spec.formats, gpu.compute_capability, gpu.memory_free_bytes)
    name = choice.format.name.lower()
    update: dict[str, object] = {"vllm_quantization": name if name in QUANTIZED else None}
    if name in DTYPES:
        update["vllm_dtype"] = DTYPES[name]
    if choice.format.path:
        update["vllm_model_path"] = choice.format.path
    update["vllm_max_model_len"] = min(settings.vllm_max_model_len, spec.max_model_len)
    return NodePlan(settings.model_copy(update=update), name, supported, healthy, ecc, choice.reason)
