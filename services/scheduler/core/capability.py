"""Can a worker's hardware serve a model format at a tier's latency target? A roofline estimate (pure).

The table (services/scheduler/policies/tables/capability.yaml) gives each format's compute precision and bytes
per parameter, the efficiencies, and each tier's targets; the hardware classes' peaks and bandwidths are
the library's datasheet table (llmbus.domain.hardware). The estimate: prefill is compute-bound (2 flops
per parameter per prompt token), a decode step memory-bound (it reads every weight once).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pydantic import Field

from llmbus.contract.config_file import StrictModel, load_yaml, shipped_or_path
from llmbus.contract.messages import ModelSpec
from llmbus.domain.hardware import engine_capacity

TABLES_DIR = Path(__file__).resolve().parent.parent / "policies" / "tables"
FALLBACK_PRECISIONS = ("fp16", "bf16", "fp32")


class Efficiency(StrictModel):
    compute: float = Field(gt=0.0, le=1.0)
    memory: float = Field(gt=0.0, le=1.0)


class FormatProfile(StrictModel):
    precision: str
    bytes_per_param: float = Field(gt=0.0)


class TierTarget(StrictModel):
    ttft_ms: float | None = Field(default=None, gt=0.0)
    tpot_ms: float | None = Field(default=None, gt=0.0)


class CapabilityTable(StrictModel):
    efficiency: Efficiency
    formats: dict[str, FormatProfile]
    tiers: dict[str, TierTarget] = Field(default_factory=dict)


@cache
def load_table(name_or_path: str) -> CapabilityTable:
    """A shipped table by name (`capability`) or a YAML path, validated (a bad file fails at start)."""
    return load_yaml(shipped_or_path(name_or_path, TABLES_DIR), CapabilityTable)


@dataclass(frozen=True)
class Estimate:
    ttft_ms: float
    tpot_ms: float


def weight_bytes_of(spec: ModelSpec | None, model_format: str | None) -> tuple[str, int] | None:
    """The format a worker runs and its weight bytes: its own format's entry, else the spec's largest
    (the conservative guess); None where the registry lists no formats for the model."""
    if spec is None or not spec.formats:
        return None
    entry = next((f for f in spec.formats if model_format and f.name.lower() == model_format.lower()), None)
    if entry is None:
        entry = max(spec.formats, key=lambda f: f.weight_bytes)
    return (entry.name.lower(), entry.weight_bytes) if entry.weight_bytes > 0 else None


def estimate(
    table: CapabilityTable,
    hardware_class: str,
    cpu_count: int,
    model_format: str,
    weight_bytes: int,
    prompt_tokens: int,
) -> Estimate | None:
    """TTFT and TPOT of one request alone on the hardware, or None where the table cannot tell."""
    fmt = table.formats.get(model_format)
    capacity = engine_capacity(hardware_class, cpu_count=cpu_count)
    if fmt is None or capacity is None:
        return None
    # Without units of the format's precision the engine computes in 16 bits (vLLM runs fp8 weights on an
    # A100 through its weight-only kernels, bf16 on a T4 as fp16), in fp32 on a CPU without them.
    peaks = (capacity.peak_tflops.get(p) for p in (fmt.precision, *FALLBACK_PRECISIONS))
    peak_tflops = next((p for p in peaks if p is not None), None)
    if peak_tflops is None:
        return None
    params = weight_bytes / fmt.bytes_per_param
    step_ms = weight_bytes / (capacity.memory_gb_per_s * 1e9 * table.efficiency.memory) * 1e3
    prefill_ms = 2 * params * prompt_tokens / (peak_tflops * 1e12 * table.efficiency.compute) * 1e3
    return Estimate(ttft_ms=prefill_ms + step_ms, tpot_ms=step_ms)


def meets(target: TierTarget, est: Estimate) -> bool:
    return (target.ttft_ms is None or est.ttft_ms <= target.ttft_ms) and (
        target.tpot_ms is None or est.tpot_ms <= target.tpot_ms
    )
