"""Hardware classes: what a node's GPUs (or CPUs) can compute and move, by the vendor's datasheet (pure).

The node agent names each node's class and peak compute from this table (NodeProfile.hardware_class,
peak_tflops) and the scheduler's capability filter estimates from it whether a worker's hardware can
serve a model format at a tier's latency target. Figures are dense (no sparsity), per GPU; for the CPU
class they are per core, and a node's are its cores' sum.

Sources: NVIDIA's data sheets (H100 / H200 Tensor Core GPU, A100 80GB and 40GB, A10, L4, L40S, T4,
V100); the CPU class is an assumption, not a measurement: one AVX-512 core with two FMA units at
~2.5 GHz (2 x 16 lanes x 2 flops x 2.5e9 = 160 GFLOP/s fp32) and ~5 GB/s of a socket's memory
bandwidth per core (about 300 GB/s over 56-64 cores).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmbus.contract.messages import GpuInfo, NodeProfile

CPU_CLASS = "cpu"
SIXTEEN_BIT = ("bf16", "fp16")


@dataclass(frozen=True)
class HardwareClass:
    name: str
    peak_tflops: dict[str, float]  # precision (bf16, fp16, fp8, int8, fp32) → dense TFLOP/s, per GPU (per CPU core)
    memory_gb_per_s: float  # per GPU (per CPU core)
    gpu_name: re.Pattern[str] | None = None  # matches NVML's device name; None: the CPU class
    memory_gib: float | None = None
    notes: str = ""

    def peak(self, precision: str) -> float | None:
        """TFLOP/s at `precision`, or None where the hardware has no such units (fp8 before Hopper/Ada, bf16 on T4)."""
        return self.peak_tflops.get(precision)

    @property
    def best_sixteen_bit_tflops(self) -> float:
        return max((self.peak_tflops[p] for p in SIXTEEN_BIT if p in self.peak_tflops), default=0.0)


def _gpu(
    name: str, pattern: str, peak: dict[str, float], gb_per_s: float, gib: float, notes: str = ""
) -> HardwareClass:
    return HardwareClass(name, peak, gb_per_s, re.compile(pattern, re.IGNORECASE), gib, notes)


# More specific names first: "H100 PCIe" before "H100", "A100 ... 40GB" before "A100".
CLASSES: tuple[HardwareClass, ...] = (
    _gpu("h200", r"\bH200\b", {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "int8": 1979.0, "fp32": 67.0}, 4800, 141),
    _gpu("h100-pcie", r"\bH100\b.*PCIe", {"bf16": 756.0, "fp16": 756.0, "fp8": 1513.0, "int8": 1513.0}, 2000, 80),
    _gpu("h100", r"\bH100\b", {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "int8": 1979.0, "fp32": 67.0}, 3350, 80),
    _gpu("a100-40gb", r"\bA100\b.*40GB", {"bf16": 312.0, "fp16": 312.0, "int8": 624.0, "fp32": 19.5}, 1555, 40),
    _gpu("a100", r"\bA100\b", {"bf16": 312.0, "fp16": 312.0, "int8": 624.0, "fp32": 19.5}, 2039, 80),
    _gpu("l40s", r"\bL40S\b", {"bf16": 362.0, "fp16": 362.0, "fp8": 733.0, "int8": 733.0, "fp32": 91.6}, 864, 48),
    _gpu("l4", r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "fp8": 242.5, "int8": 242.5, "fp32": 30.3}, 300, 24),
    _gpu("a10", r"\bA10\b", {"bf16": 125.0, "fp16": 125.0, "int8": 250.0, "fp32": 31.2}, 600, 24),
    _gpu("v100", r"\bV100\b", {"fp16": 125.0, "fp32": 15.7}, 900, 32, "no bf16 units"),
    _gpu("t4", r"\bT4\b", {"fp16": 65.0, "int8": 130.0, "fp32": 8.1}, 320, 16, "no bf16 units"),
)
CPU = HardwareClass(CPU_CLASS, {"fp32": 0.16, "bf16": 0.16}, 5.0, notes="per core; an assumption (module docstring)")
BY_NAME: dict[str, HardwareClass] = {c.name: c for c in (*CLASSES, CPU)}


def gpu_class(gpu_name: str) -> HardwareClass | None:
    """The class of an NVML device name ('NVIDIA A100-SXM4-80GB' → a100); None for a GPU the table lacks."""
    return next((c for c in CLASSES if c.gpu_name is not None and c.gpu_name.search(gpu_name)), None)


def node_class(profile: NodeProfile) -> HardwareClass | None:
    """The class placement judges the node by: its first GPU's, the CPU class on a node without GPUs,
    None for a GPU the table does not know."""
    if not profile.gpus:
        return CPU
    return gpu_class(profile.gpus[0].name)


def gpu_peak_tflops(gpu: GpuInfo) -> float | None:
    cls = gpu_class(gpu.name)
    return cls.best_sixteen_bit_tflops if cls is not None else None


def node_peak_tflops(profile: NodeProfile) -> float | None:
    """Dense peak of the whole node at its best 16-bit precision (its CPU cores' fp32 on a CPU node)."""
    if not profile.gpus:
        return round(CPU.peak_tflops["fp32"] * max(1, profile.cpu_count), 3)
    peaks = [gpu_peak_tflops(g) for g in profile.gpus]
    return None if any(p is None for p in peaks) else round(sum(p for p in peaks if p is not None), 3)


@dataclass(frozen=True)
class Capacity:
    """What one engine on the node computes with: peak TFLOP/s by precision and memory bandwidth (GB/s)."""

    hardware_class: str
    peak_tflops: dict[str, float]
    memory_gb_per_s: float


def engine_capacity(hardware_class: str, cpu_count: int = 1, gpus: int = 1) -> Capacity | None:
    """An engine's capacity on `gpus` GPUs of the class (tensor parallel), or on the node's `cpu_count` cores."""
    cls = BY_NAME.get(hardware_class)
    if cls is None:
        return None
    units = max(1, cpu_count) if cls is CPU else max(1, gpus)
    return Capacity(cls.name, {p: v * units for p, v in cls.peak_tflops.items()}, cls.memory_gb_per_s * units)
