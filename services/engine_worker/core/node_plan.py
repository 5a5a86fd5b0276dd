"""What this node runs the model as (pure): the format choice applied to the worker's settings.

The engine's GPUs are the first tensor_parallel_size x pipeline_parallel_size of those the process sees:
CUDA_VISIBLE_DEVICES (indices or GPU UUIDs, in its order) picks them from the node's, as it does for vLLM;
unset, the node's in index order. The format must run on and fit every one of them (core/formats.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmbus.contract.messages import GpuInfo, ModelSpec, NodeProfile
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.formats import (
    NoFormatFits,
    choose_format,
    parse_compute_capability,
    supported_formats,
)

QUANTIZED = {"fp8", "awq", "gptq"}
ENGINE_FORMATS = {"onnx": "onnx"}  # engines that run one format whatever the node
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


def from_catalog(settings: WorkerSettings, spec: ModelSpec | None) -> WorkerSettings:
    """The settings with what the worker's own settings leave unset taken from the model's catalog entry:
    the window (max_model_len), the streams in flight (max_num_seqs) and the tokenizer, for the sim and
    openai-http engines (vLLM's window is bounded by the entry in plan_for; it counts with its own)."""
    if spec is None:
        return settings
    catalog = {
        "sim_max_model_len": spec.max_model_len,
        "openai_max_model_len": spec.max_model_len,
        "sim_max_num_seqs": spec.max_num_seqs,
        "openai_max_num_seqs": spec.max_num_seqs,
        "tokenizer": spec.tokenizer,
    }
    update = {name: value for name, value in catalog.items() if getattr(settings, name) is None and value is not None}
    return settings.model_copy(update=update) if update else settings


def visible_gpus(profile: NodeProfile, cuda_visible_devices: str | None) -> tuple[list[GpuInfo], str]:
    """The node's GPUs this process sees, in CUDA's order, and how they were picked.

    Entries are indices or (prefixes of) GPU UUIDs; CUDA stops at the first entry it cannot find. An entry
    NVML's profile cannot place (a MIG instance) leaves the node's order, said in the note."""
    by_index = sorted(profile.gpus, key=lambda g: g.index)
    if cuda_visible_devices is None:
        return by_index, "the node's GPUs"
    seen: list[GpuInfo] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        if entry.startswith("MIG-"):
            return by_index, f"the node's GPUs (CUDA_VISIBLE_DEVICES={cuda_visible_devices} names MIG instances)"
        match = _find(entry, by_index)
        if match is None or match in seen:
            break
        seen.append(match)
    return seen, f"CUDA_VISIBLE_DEVICES={cuda_visible_devices}"


def _find(entry: str, gpus: list[GpuInfo]) -> GpuInfo | None:
    if entry.isdigit():
        return next((g for g in gpus if g.index == int(entry)), None)
    if entry.startswith("GPU-"):
        return next((g for g in gpus if g.uuid.startswith(entry)), None)
    return None


def _lowest_cc(gpus: list[GpuInfo]) -> str:
    return min((g.compute_capability for g in gpus), key=parse_compute_capability)


def plan_for(
    settings: WorkerSettings, profile: NodeProfile, spec: ModelSpec | None, cuda_visible_devices: str | None = None
) -> NodePlan:
    """Choose the format on a GPU node when the model lists formats; raises NoFormatFits if none fits its GPUs.
    What the settings leave unset comes from the model's catalog entry (from_catalog)."""
    settings = from_catalog(settings, spec)
    ecc = sum(g.ecc_uncorrected_volatile or 0 for g in profile.gpus)
    healthy = gpu_healthy(profile)
    if not profile.gpus:
        own = ENGINE_FORMATS.get(settings.engine)  # an engine of one format (onnx) says it; the others their dtype
        return NodePlan(settings, own, [own] if own else [], healthy, ecc, "CPU node: the engine's own format")
    visible, picked = visible_gpus(profile, cuda_visible_devices)
    needed = settings.vllm_tensor_parallel_size * settings.vllm_pipeline_parallel_size
    group = visible[:needed]
    supported = supported_formats(_lowest_cc(group or profile.gpus))
    if settings.engine != "vllm" or spec is None or not spec.formats:
        return NodePlan(settings, None, supported, healthy, ecc, "no formats listed for the model")
    if len(group) < needed:
        raise NoFormatFits(
            f"tensor_parallel_size {settings.vllm_tensor_parallel_size} x pipeline_parallel_size "
            f"{settings.vllm_pipeline_parallel_size} needs {needed} GPUs; {picked} shows {len(visible)}"
        )
    max_model_len = min(settings.vllm_max_model_len or spec.max_model_len, spec.max_model_len)
    choice = choose_format(
        spec.formats,
        _lowest_cc(group),
        min(g.memory_free_bytes for g in group),
        gpus=needed,
        kv_cache_bytes=(spec.kv_bytes_per_token or 0) * max_model_len,
    )
    name = choice.format.name.lower()
    update: dict[str, object] = {"vllm_quantization": name if name in QUANTIZED else None}
    if name in DTYPES:
        update["vllm_dtype"] = DTYPES[name]
    if choice.format.path:
        update["vllm_model_path"] = choice.format.path
    update["vllm_max_model_len"] = max_model_len
    reason = choice.reason if needed == 1 else f"{choice.reason}; GPUs {[g.index for g in group]} ({picked})"
    return NodePlan(settings.model_copy(update=update), name, supported, healthy, ecc, reason)
