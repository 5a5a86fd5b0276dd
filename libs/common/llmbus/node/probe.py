"""Profile this node's hardware through NVML (nvidia-ml-py), or its CPU and memory where there is no GPU.

Every optional NVML reading (ECC, temperature, power) may be unsupported on a given board or
inside a VM / MIG slice: such a field is left None rather than failing the profile. ECC counts
are read both volatile (since the driver loaded) and aggregate (lifetime), as DCGM does. The node's
hardware class and peak compute come from the datasheet table (llmbus.domain.hardware).

The node agent probes with it (services/node_agent), and so does an engine-worker on a node without one.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from llmbus.contract.messages.fleet import GpuInfo, NodeProfile
from llmbus.domain.hardware import gpu_peak_tflops, node_class, node_peak_tflops


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(nvml: ModuleType, read: Callable[[], Any]) -> Any:
    """An NVML reading, or None where the device or driver does not support it."""
    try:
        return read()
    except nvml.NVMLError:
        return None


def _gpu_info(nvml: ModuleType, index: int) -> GpuInfo:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(h)

    def ecc(error_type: int, counter: int) -> int | None:
        return _optional(nvml, lambda: int(nvml.nvmlDeviceGetTotalEccErrors(h, error_type, counter)))

    def temperature() -> int:
        getter = getattr(nvml, "nvmlDeviceGetTemperatureV", None) or nvml.nvmlDeviceGetTemperature
        return int(getter(h, nvml.NVML_TEMPERATURE_GPU))

    power_mw = _optional(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(h))
    corrected, uncorrected = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    name = _text(nvml.nvmlDeviceGetName(h))
    info = GpuInfo(
        index=index,
        name=name,
        uuid=_text(nvml.nvmlDeviceGetUUID(h)),
        memory_total_bytes=int(mem.total),
        memory_free_bytes=int(mem.free),
        compute_capability=f"{major}.{minor}",
        ecc_corrected_volatile=ecc(corrected, nvml.NVML_VOLATILE_ECC),
        ecc_uncorrected_volatile=ecc(uncorrected, nvml.NVML_VOLATILE_ECC),
        ecc_corrected_aggregate=ecc(corrected, nvml.NVML_AGGREGATE_ECC),
        ecc_uncorrected_aggregate=ecc(uncorrected, nvml.NVML_AGGREGATE_ECC),
        temperature_c=_optional(nvml, temperature),
        power_w=None if power_mw is None else power_mw / 1000.0,
    )
    info.peak_tflops = gpu_peak_tflops(info)
    return info


def _cuda_version(nvml: ModuleType) -> str | None:
    getter = getattr(nvml, "nvmlSystemGetCudaDriverVersion_v2", None) or nvml.nvmlSystemGetCudaDriverVersion
    version = _optional(nvml, getter)
    if version is None:
        return None
    return f"{int(version) // 1000}.{int(version) % 1000 // 10}"  # 12040 → "12.4"


def _cpu_model(cpuinfo: Path) -> str | None:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _meminfo_bytes(meminfo: Path) -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes; /proc/meminfo counts in kB."""
    values: dict[str, int] = {}
    try:
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                values[key] = int(parts[0]) * 1024
    except OSError:
        return 0, 0
    return values.get("MemTotal", 0), values.get("MemAvailable", values.get("MemFree", 0))


def _load_nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver / library: a CPU node
        return None
    return pynvml


def profile_node(
    node_id: str | None = None,
    nvml: ModuleType | None = None,
    proc_dir: Path = Path("/proc"),
) -> NodeProfile:
    """The node's profile: kind "gpu" with every GPU NVML sees, else kind "cpu"."""
    hostname = socket.gethostname()
    mem_total, mem_free = _meminfo_bytes(proc_dir / "meminfo")
    base: dict[str, Any] = {
        "node_id": node_id or hostname,
        "hostname": hostname,
        "cpu_model": _cpu_model(proc_dir / "cpuinfo"),
        "cpu_count": os.cpu_count() or 0,
        "memory_total_bytes": mem_total,
        "memory_free_bytes": mem_free,
    }
    owns_init = nvml is None
    nvml = nvml or _load_nvml()
    if nvml is None:
        return _classified(NodeProfile(kind="cpu", **base))
    try:
        count = int(nvml.nvmlDeviceGetCount())
        if count == 0:
            return _classified(NodeProfile(kind="cpu", **base))
        return _classified(
            NodeProfile(
                kind="gpu",
                driver_version=_optional(nvml, lambda: _text(nvml.nvmlSystemGetDriverVersion())),
                cuda_driver_version=_cuda_version(nvml),
                gpus=[_gpu_info(nvml, i) for i in range(count)],
                **base,
            )
        )
    finally:
        if owns_init:
            nvml.nvmlShutdown()


def _classified(profile: NodeProfile) -> NodeProfile:
    cls = node_class(profile)
    profile.hardware_class = cls.name if cls is not None else None
    profile.peak_tflops = node_peak_tflops(profile)
    return profile
