"""Prometheus gauges of the node profile, named like DCGM's exporter fields where they mean the same.

The node agent serves them on its /metrics (one set per node); an engine-worker serves its node's too.

Units follow DCGM so that dashboards and alerts written for dcgm-exporter read these as they
are: framebuffer in MiB, temperature in °C, power in W, ECC counts as totals. Labels follow
dcgm-exporter's (`gpu`, `UUID`, `modelName`, `Hostname`). Values are read from the latest
profile at scrape time (a custom collector), so re-profiling never re-registers anything.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from llmbus.contract.messages.fleet import GpuInfo, NodeHealth, NodeProfile

_MIB = 1024 * 1024
_LABELS = ["gpu", "UUID", "modelName", "Hostname"]

# (metric name, help, reading of one GPU or None where unsupported)
GPU_GAUGES: tuple[tuple[str, str, Callable[[GpuInfo], float | None]], ...] = (
    ("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", lambda g: g.memory_total_bytes / _MIB),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda g: g.memory_free_bytes / _MIB),
    (
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        lambda g: (g.memory_total_bytes - g.memory_free_bytes) / _MIB,
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.power_w),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Single-bit volatile ECC errors.", lambda g: g.ecc_corrected_volatile),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Double-bit volatile ECC errors.", lambda g: g.ecc_uncorrected_volatile),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Single-bit persistent ECC errors.", lambda g: g.ecc_corrected_aggregate),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Double-bit persistent ECC errors.", lambda g: g.ecc_uncorrected_aggregate),
    ("llmbus_gpu_peak_tflops", "Dense peak at the best 16-bit precision (datasheet).", lambda g: g.peak_tflops),
)


class NodeProfileCollector(Collector):
    def __init__(self, latest_profile: Callable[[], NodeProfile | None]) -> None:
        self._latest = latest_profile

    def collect(self) -> Iterator[GaugeMetricFamily]:
        profile = self._latest()
        if profile is None:
            return
        for name, help_text, read in GPU_GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=_LABELS)
            for gpu in profile.gpus:
                value = read(gpu)
                if value is not None:  # unsupported readings are absent, not 0
                    family.add_metric([str(gpu.index), gpu.uuid, gpu.name, profile.hostname], float(value))
            yield family
        host = GaugeMetricFamily("llmbus_node_memory_bytes", "Host memory (bytes).", labels=["state", "Hostname"])
        host.add_metric(["total", profile.hostname], float(profile.memory_total_bytes))
        host.add_metric(["free", profile.hostname], float(profile.memory_free_bytes))
        yield host
        yield from _node_families(profile)


def _node_families(profile: NodeProfile) -> Iterator[GaugeMetricFamily]:
    """The node as a whole: what it is (an info gauge), its peak compute, its health as a state set."""
    info = GaugeMetricFamily(
        "llmbus_node_info",
        "The node: kind, hardware class, driver and CUDA driver, CPU, who profiled it (value 1).",
        labels=["Hostname", "node", "kind", "hardware_class", "driver_version", "cuda_driver_version", "cpu", "source"],
    )
    info.add_metric(
        [
            profile.hostname,
            profile.node_id,
            profile.kind,
            profile.hardware_class or "unknown",
            profile.driver_version or "",
            profile.cuda_driver_version or "",
            profile.cpu_model or "",
            profile.source,
        ],
        1.0,
    )
    yield info
    if profile.peak_tflops is not None:
        peak = GaugeMetricFamily("llmbus_node_peak_tflops", "The node's dense peak compute (TFLOP/s).", labels=["node"])
        peak.add_metric([profile.node_id], profile.peak_tflops)
        yield peak
    health = GaugeMetricFamily(
        "llmbus_node_health", "1 for the node's health state, 0 for the others.", labels=["node", "state"]
    )
    for state in NodeHealth:
        health.add_metric([profile.node_id, state.value], 1.0 if profile.health == state else 0.0)
    yield health


# One collector per registry: a worker started again in the same process (an embedding host, a test that
# runs the worker in-process) points it at its own profile instead of registering the same names twice.
_COLLECTORS: weakref.WeakKeyDictionary[CollectorRegistry, NodeProfileCollector] = weakref.WeakKeyDictionary()


def register_node_metrics(registry: CollectorRegistry, latest_profile: Callable[[], NodeProfile | None]) -> None:
    collector = _COLLECTORS.get(registry)
    if collector is not None:
        collector._latest = latest_profile
        return
    collector = _COLLECTORS[registry] = NodeProfileCollector(latest_profile)
    registry.register(collector)
