"""The node agent's own wiring (app.build_app over a stand-in NVML) in memory and on the real broker: its first
profile on llm.nodes at start, then each interval's (the timer's job, called here) judged from the GPUs' ECC
counts, and its gauges saying the latest."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import REGISTRY, generate_latest

from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import NodeHealth, NodeProfile
from llmbus_services.node_agent.app import build_app
from llmbus_services.node_agent.config import NodeAgentSettings
from tests.fixtures.buses import EitherBus
from tests.fixtures.fake_nvml import FakeGpu, make_fake_nvml

pytestmark = pytest.mark.redis

A100 = "NVIDIA A100-SXM4-80GB"


def ecc(corrected: int = 0, uncorrected: int = 0) -> dict[tuple[int, int], int]:
    # NVML's keys: (error type, counter) with corrected = 0, uncorrected = 1, volatile = 0, aggregate = 1
    return {(0, 0): corrected, (1, 0): uncorrected, (0, 1): corrected, (1, 1): uncorrected}


async def test_the_first_profile_goes_out_at_start_and_each_next_one_is_judged_from_the_ecc_counts(
    on_bus: EitherBus,
) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    gpus = [FakeGpu(name=A100, cc=(8, 0), uuid=f"GPU-{i}", ecc=ecc()) for i in range(2)]
    cfg = NodeAgentSettings(node_id=node, interval_s=3600, ecc_corrected_degraded_above=10)
    runtime = await on_bus.runtime(contracts.NODE_AGENT)
    handlers = build_app(runtime, cfg, make_fake_nvml(gpus))
    nodes = on_bus.topics.name(t.NODES)
    await on_bus.start(runtime)  # returns once the first profile is published
    [first] = await on_bus.published(nodes, NodeProfile, until=lambda found: len(found) >= 1)
    assert (first.node_id, first.source, first.kind, first.hardware_class) == (node, "agent", "gpu", "a100")
    assert first.peak_tflops == 2 * 312.0 and [g.uuid for g in first.gpus] == ["GPU-0", "GPU-1"]
    assert (first.health, first.health_reason) == (NodeHealth.OK, "") and handlers.latest == first

    gpus[1].ecc = ecc(corrected=11)
    await handlers.profile_once()  # what the timer runs each interval
    gpus[0].ecc = ecc(uncorrected=1)
    await handlers.profile_once()
    profiles = await on_bus.published(nodes, NodeProfile, until=lambda found: len(found) >= 3)
    assert [(p.node_id, p.health, p.health_reason) for p in profiles] == [
        (node, NodeHealth.OK, ""),
        (node, NodeHealth.DEGRADED, "GPU 1: 11 corrected ECC errors (> 10)"),
        (node, NodeHealth.UNHEALTHY, "GPU 0: 1 uncorrected ECC errors (> 0)"),
    ]
    gauges = generate_latest(REGISTRY).decode()  # this process's /metrics: the latest profile
    assert f'llmbus_node_health{{node="{node}",state="unhealthy"}} 1.0' in gauges
    assert f'llmbus_node_health{{node="{node}",state="ok"}} 0.0' in gauges
    assert not runtime.contract.undeclared(on_bus.topics, runtime.publisher.topics_written)
