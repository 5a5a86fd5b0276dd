"""DCGM-named gauges exported from the node profile."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from llmbus.contract.messages.fleet import NodeProfile
from llmbus.node.gauges import register_node_metrics
from llmbus.node.probe import profile_node
from tests.fixtures.fake_nvml import FakeGpu, make_fake_nvml


def test_gauges_use_dcgm_names_units_and_labels(tmp_path: Path) -> None:
    gpus = [FakeGpu(total_bytes=80 * 1024**3, free_bytes=60 * 1024**3), FakeGpu(uuid="GPU-b", power_mw=None, ecc=None)]
    profile = profile_node("n1", nvml=make_fake_nvml(gpus), proc_dir=tmp_path)
    latest: list[NodeProfile | None] = [profile]
    registry = CollectorRegistry()
    register_node_metrics(registry, lambda: latest[0])

    text = generate_latest(registry).decode()
    host = profile.hostname
    assert (
        f'DCGM_FI_DEV_FB_TOTAL{{Hostname="{host}",UUID="{gpus[0].uuid}",gpu="0",modelName="{gpus[0].name}"}} 81920.0'
        in text
    )
    assert (
        registry.get_sample_value(
            "DCGM_FI_DEV_FB_FREE", {"gpu": "0", "UUID": gpus[0].uuid, "modelName": gpus[0].name, "Hostname": host}
        )
        == 61440.0
    )
    labels0 = {"gpu": "0", "UUID": gpus[0].uuid, "modelName": gpus[0].name, "Hostname": host}
    labels1 = {**labels0, "gpu": "1", "UUID": "GPU-b"}
    assert registry.get_sample_value("DCGM_FI_DEV_FB_USED", labels0) == 20480.0
    assert registry.get_sample_value("DCGM_FI_DEV_POWER_USAGE", labels0) == 71.234
    assert registry.get_sample_value("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", labels0) == 1
    assert registry.get_sample_value("DCGM_FI_DEV_GPU_TEMP", labels1) == 41
    # Unsupported on GPU 1: absent, never a fake 0.
    assert registry.get_sample_value("DCGM_FI_DEV_POWER_USAGE", labels1) is None
    assert registry.get_sample_value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", labels1) is None

    latest[0] = profile.model_copy(update={"gpus": []})  # re-profiled: read at scrape time
    assert registry.get_sample_value("DCGM_FI_DEV_FB_FREE", labels0) is None


def test_a_worker_started_again_in_the_same_process_reports_its_own_profile(tmp_path: Path) -> None:
    first = profile_node("n1", nvml=make_fake_nvml([FakeGpu(free_bytes=10 * 1024**3)]), proc_dir=tmp_path)
    second = profile_node("n1", nvml=make_fake_nvml([FakeGpu(free_bytes=20 * 1024**3)]), proc_dir=tmp_path)
    registry = CollectorRegistry()
    register_node_metrics(registry, lambda: first)
    register_node_metrics(registry, lambda: second)  # the same names: no DuplicateTimeseries
    gpu = second.gpus[0]
    labels = {"gpu": "0", "UUID": gpu.uuid, "modelName": gpu.name, "Hostname": second.hostname}
    assert registry.get_sample_value("DCGM_FI_DEV_FB_FREE", labels) == 20480.0
