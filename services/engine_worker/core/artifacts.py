"""Which of a model version's artifacts this node runs, and what that does to the worker's plan (pure).

A GPU node takes the format rule of formats.py through plan_for (compute capability, 0.85 x free VRAM,
quality order), each artifact standing for its format with its size as the weights' bytes. A CPU node
takes the best CPU-capable format (fp32 > bf16 > fp16: quantised kernels are GPU kernels) whose files
fit in 0.85 x the node's free memory.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmbus.contract.messages import ModelSpec, NodeProfile
from llmbus.contract.messages.artifacts import ModelArtifact
from llmbus.contract.messages.fleet import ModelFormat
from llmbus_services.engine_worker.core.formats import DEFAULT_HEADROOM, NoFormatFits
from llmbus_services.engine_worker.core.node_plan import DTYPES, QUANTIZED, NodePlan, plan_for

CPU_FORMATS: tuple[str, ...] = ("fp32", "bf16", "fp16")  # best first
CPU_DTYPES = DTYPES | {"fp32": "float32"}


class UnknownModelVersion(LookupError):
    """The registry has no such version, or no artifacts for it."""


def artifacts_of(table: Mapping[str, ModelSpec], name: str, version: str | None) -> list[ModelArtifact]:
    """The artifacts the registry lists for NAME@VERSION (a record keyed `name@version`, or `name` at that
    version; no version: the one `name` serves). Raises UnknownModelVersion saying what is missing."""
    record = (table.get(f"{name}@{version}") if version else None) or table.get(name)
    if record is None or (version is not None and record.version != version):
        raise UnknownModelVersion(f"{name}@{version or 'serving'} is not in the registry (llm.models)")
    version = record.version
    artifacts: list[ModelArtifact] = list(getattr(record, "artifacts", None) or [])
    if not artifacts:
        raise UnknownModelVersion(f"{name}@{version}: the registry lists no artifacts for it")
    return artifacts


def choose_artifact(
    plan: NodePlan, profile: NodeProfile, artifacts: list[ModelArtifact]
) -> tuple[ModelArtifact, NodePlan]:
    """The artifact to fetch and the plan with its format applied (its path is set once it is fetched).
    Raises NoFormatFits naming what each artifact needed."""
    settings = plan.settings
    if profile.gpus and settings.engine == "vllm":
        formats = [ModelFormat(name=a.format, weight_bytes=a.size_bytes) for a in artifacts]
        spec = ModelSpec(name=settings.model, version=settings.model_version or "1", formats=formats)
        if settings.vllm_max_model_len is not None:  # else the model's own window: vLLM's default
            spec.max_model_len = settings.vllm_max_model_len
        gpu_plan = plan_for(settings, profile, spec)
        chosen = next(a for a in artifacts if a.format.lower() == gpu_plan.model_format)
        return chosen, gpu_plan
    return _choose_on_cpu(plan, profile, artifacts)


def _choose_on_cpu(
    plan: NodePlan, profile: NodeProfile, artifacts: list[ModelArtifact]
) -> tuple[ModelArtifact, NodePlan]:
    settings = plan.settings
    usable = int(profile.memory_free_bytes * DEFAULT_HEADROOM)  # 0: the profile did not say: no memory check
    rejected, candidates = [], []
    for artifact in artifacts:
        name = artifact.format.lower()
        if name not in CPU_FORMATS:
            rejected.append(f"{artifact.format}: not a CPU format")
        elif usable and artifact.size_bytes > usable:
            rejected.append(f"{artifact.format}: {artifact.size_bytes / 1e9:.2f} GB, {usable / 1e9:.2f} GB usable")
        else:
            candidates.append((CPU_FORMATS.index(name), artifact))
    if not candidates:
        raise NoFormatFits(f"no artifact runs on this CPU node: {'; '.join(rejected)}")
    _, chosen = min(candidates, key=lambda c: (c[0], c[1].size_bytes))
    name = chosen.format.lower()
    update: dict[str, object] = {"vllm_quantization": None}
    if settings.engine == "vllm":
        update["vllm_dtype"] = CPU_DTYPES[name]
    reason = f"CPU node: {chosen.format} ({chosen.size_bytes / 1e9:.2f} GB)"
    if rejected:
        reason += f" (not: {'; '.join(rejected)})"
    chosen_plan = NodePlan(
        settings.model_copy(update=update), name, plan.formats_supported, plan.gpu_healthy, plan.ecc_uncorrected, reason
    )
    return chosen, chosen_plan


def with_local_path(plan: NodePlan, artifact: ModelArtifact, path: str) -> NodePlan:
    """The plan loading the fetched artifact from the node's cache."""
    name = artifact.format.lower()
    update: dict[str, object] = {"vllm_model_path": path}
    if name in QUANTIZED:
        update["vllm_quantization"] = name
    settings = plan.settings.model_copy(update=update)
    return NodePlan(settings, name, plan.formats_supported, plan.gpu_healthy, plan.ecc_uncorrected, plan.reason)


def with_fetch_phases(phases: dict[str, float], fetch_s: float, verify_s: float) -> dict[str, float]:
    """`fetch` and `verify` after `startup` in the cold-start phases, carved out of it (they ran inside it)."""
    out = {"startup": round(max(0.0, phases.get("startup", 0.0) - fetch_s - verify_s), 3)}
    out |= {"fetch": round(fetch_s, 3), "verify": round(verify_s, 3)}
    out |= {k: v for k, v in phases.items() if k != "startup"}
    return out
