"""Node profiling through NVML (a fake pynvml: no GPU here) and the CPU fallback from /proc."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llmbus.node.probe import profile_node
from llmbus_services.engine_worker.core.node_plan import gpu_healthy
from tests.fixtures.fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeGpu, make_fake_nvml


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    (tmp_path / "cpuinfo").write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core\n"
    )
    (tmp_path / "meminfo").write_text(
        "MemTotal:       263843516 kB\nMemFree:        1000 kB\nMemAvailable:   250000000 kB\n"
    )
    return tmp_path


def test_gpu_profile_reads_every_nvml_field(proc: Path) -> None:
    nvml = make_fake_nvml([FakeGpu(), FakeGpu(uuid="GPU-second", cc=(8, 0), free_bytes=1_000)])
    p = profile_node("node-a", nvml=nvml, proc_dir=proc)

    assert (p.kind, p.node_id, p.driver_version, p.cuda_driver_version) == ("gpu", "node-a", "550.54.15", "12.4")
    g0, g1 = p.gpus
    assert (g0.index, g0.name, g0.uuid) == (0, "NVIDIA H100 80GB HBM3", "GPU-00000000-1111-2222-3333-444444444444")
    assert (g0.memory_total_bytes, g0.memory_free_bytes, g0.compute_capability) == (
        85_520_809_984,
        84_000_000_000,
        "9.0",
    )
    assert (g0.ecc_corrected_volatile, g0.ecc_uncorrected_volatile) == (2, 0)
    assert (g0.ecc_corrected_aggregate, g0.ecc_uncorrected_aggregate) == (17, 1)
    assert (g0.temperature_c, g0.power_w) == (41, pytest.approx(71.234))
    assert (g1.uuid, g1.compute_capability, g1.memory_free_bytes) == ("GPU-second", "8.0", 1_000)
    assert (p.cpu_model, p.memory_total_bytes, p.memory_free_bytes) == (
        "AMD EPYC 9654 96-Core",
        263843516 * 1024,
        250000000 * 1024,
    )


def test_unsupported_readings_are_none_not_errors(proc: Path) -> None:
    gpu = FakeGpu(ecc={(0, 0): 5}, temperature_c=None, power_mw=None)  # e.g. a GeForce board or a VM slice
    p = profile_node(nvml=make_fake_nvml([gpu]), proc_dir=proc)
    g = p.gpus[0]
    assert g.ecc_corrected_volatile == 5
    assert g.ecc_uncorrected_volatile is g.ecc_corrected_aggregate is g.ecc_uncorrected_aggregate is None
    assert g.temperature_c is None and g.power_w is None


def test_no_nvml_library_gives_a_cpu_profile(proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_nvml([], init_error=NVML_ERROR_LIBRARY_NOT_FOUND))
    p = profile_node(proc_dir=proc)
    assert p.kind == "cpu" and p.gpus == [] and p.driver_version is None
    assert p.cpu_model == "AMD EPYC 9654 96-Core" and p.cpu_count >= 1


def test_nvml_without_gpus_gives_a_cpu_profile_and_shuts_nvml_down(proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = make_fake_nvml([])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    p = profile_node(proc_dir=proc)
    assert p.kind == "cpu"
    assert fake.calls == {"init": 1, "shutdown": 1}


def test_real_machine_profile_is_consistent() -> None:
    # The real NVML and /proc, whatever this machine has: a GPU profile, or the CPU one where NVML finds none.
    p = profile_node()
    assert p.kind in ("cpu", "gpu") and (p.kind == "gpu") == bool(p.gpus)
    assert 0 < p.memory_free_bytes <= p.memory_total_bytes
    assert p.cpu_count >= 1


def test_gpu_health_follows_uncorrected_volatile_ecc(proc: Path) -> None:
    clean = profile_node(nvml=make_fake_nvml([FakeGpu()]), proc_dir=proc)
    assert gpu_healthy(clean)
    bad = profile_node(nvml=make_fake_nvml([FakeGpu(), FakeGpu(ecc={(1, 0): 3})]), proc_dir=proc)
    assert not gpu_healthy(bad)
    assert gpu_healthy(bad, max_uncorrected_volatile=3)
