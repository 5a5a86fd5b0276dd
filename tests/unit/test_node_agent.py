"""The node agent: health from ECC counts (ok, degraded over the corrected threshold, unhealthy over the
uncorrected one), its profile marked as the agent's and published each interval, and its gauges."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from llmbus.bus.memory import MemoryBus
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import NodeHealth, NodeProfile
from llmbus.node.gauges import register_node_metrics
from llmbus.node.probe import profile_node
from llmbus.settings import BusSettings
from llmbus_services.node_agent.app import build_app
from llmbus_services.node_agent.config import NodeAgentSettings
from llmbus_services.node_agent.core.health import EccThresholds, judge
from llmbus_services.node_agent.flows import NodeAgentHandlers
from tests.fixtures.fake_nvml import FakeGpu, make_fake_nvml

THRESHOLDS = EccThresholds(corrected_degraded_above=10, uncorrected_unhealthy_above=0)


def gpu_profile(tmp_path: Path, *gpus: FakeGpu) -> NodeProfile:
    return profile_node("gpu-1", nvml=make_fake_nvml(list(gpus)), proc_dir=tmp_path)


def ecc(corrected: int = 0, uncorrected: int = 0) -> dict[tuple[int, int], int]:
    # NVML's keys: (error type, counter) with corrected = 0, uncorrected = 1, volatile = 0, aggregate = 1
    return {(0, 0): corrected, (1, 0): uncorrected, (0, 1): corrected, (1, 1): uncorrected}


def test_health_follows_the_ecc_thresholds(tmp_path: Path) -> None:
    assert judge(gpu_profile(tmp_path, FakeGpu(ecc=ecc(corrected=10))), THRESHOLDS) == (NodeHealth.OK, "")
    health, reason = judge(gpu_profile(tmp_path, FakeGpu(), FakeGpu(ecc=ecc(corrected=11))), THRESHOLDS)
    assert health == NodeHealth.DEGRADED and reason == "GPU 1: 11 corrected ECC errors (> 10)"
    health, reason = judge(gpu_profile(tmp_path, FakeGpu(ecc=ecc(corrected=50, uncorrected=1))), THRESHOLDS)
    assert health == NodeHealth.UNHEALTHY and reason == "GPU 0: 1 uncorrected ECC errors (> 0)"
    assert judge(profile_node("cpu-1", proc_dir=tmp_path), THRESHOLDS) == (NodeHealth.OK, "")  # no GPU: no ECC


async def test_each_profile_is_the_agents_judged_and_published(tmp_path: Path) -> None:
    gpu = FakeGpu(name="NVIDIA A10", ecc=ecc())
    nvml = make_fake_nvml([gpu])
    published: list[NodeProfile] = []

    async def probe() -> NodeProfile:
        return profile_node("gpu-1", nvml=nvml, proc_dir=tmp_path)

    async def publish(profile: NodeProfile) -> None:
        published.append(profile)

    handlers = NodeAgentHandlers(probe, publish, THRESHOLDS)
    first = await handlers.profile_once()
    assert (first.source, first.health, first.hardware_class, first.peak_tflops) == (
        "agent",
        NodeHealth.OK,
        "a10",
        125.0,
    )
    gpu.ecc = ecc(corrected=40)
    second = await handlers.profile_once()
    assert second.health == NodeHealth.DEGRADED and handlers.latest is second
    assert [p.health for p in published] == [NodeHealth.OK, NodeHealth.DEGRADED]


async def test_the_app_publishes_its_first_profile_at_start_on_llm_nodes_keyed_by_node() -> None:
    """On the service runtime (in memory): the start publishes the first profile, before any interval."""
    bus = MemoryBus(BusSettings(topic_prefix="unit."))
    runtime = bus.runtime(contracts.NODE_AGENT)
    handlers = build_app(runtime, NodeAgentSettings(node_id="gpu-7", interval_s=60), make_fake_nvml([FakeGpu()]))
    await runtime.start()
    try:
        topic = bus.topics.name(t.NODES)
        (profile,) = bus.published(topic, NodeProfile)
        assert [r.key for r in bus.log.records if r.topic == topic] == [b"gpu-7"]
        assert profile.source == "agent" and profile.hardware_class == "h100" and profile.node_id == "gpu-7"
        assert handlers.latest == profile and runtime.ready.is_set()
    finally:
        await runtime.stop()


def test_the_gauges_say_what_the_node_is_its_peak_and_its_health(tmp_path: Path) -> None:
    profile = gpu_profile(tmp_path, FakeGpu(name="NVIDIA A10"), FakeGpu(name="NVIDIA A10"))
    profile.source, profile.health = "agent", NodeHealth.DEGRADED
    registry = CollectorRegistry()
    register_node_metrics(registry, lambda: profile)
    text = generate_latest(registry).decode()
    assert 'llmbus_node_info{Hostname="' in text and 'hardware_class="a10"' in text and 'source="agent"' in text
    assert 'driver_version="550.54.15"' in text
    assert 'llmbus_node_peak_tflops{node="gpu-1"} 250.0' in text
    assert 'llmbus_node_health{node="gpu-1",state="degraded"} 1.0' in text
    assert 'llmbus_node_health{node="gpu-1",state="ok"} 0.0' in text
    assert text.count("llmbus_gpu_peak_tflops{") == 2
