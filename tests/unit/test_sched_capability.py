"""Placement by capability: a roofline estimate per hardware class and format, checked against the sim's
calibrated profiles; the filter admits only hardware that meets the tier's target; the scorer puts work on
the smallest capable hardware; the node agent's health drains high-priority work."""

from __future__ import annotations

import pytest

from llmbus.contract.messages import GpuInfo, ModelFormat, ModelSpec, NodeHealth, NodeProfile
from llmbus.domain.hardware import gpu_class, node_class, node_peak_tflops
from llmbus_services.engine_worker.adapters.engines.sim.profiles import get_profile
from llmbus_services.scheduler.core.capability import estimate, load_table
from llmbus_services.scheduler.core.plugins.filters_capability import CapableHardwareFilter
from llmbus_services.scheduler.core.plugins.filters_health import NodeHealthFilter
from llmbus_services.scheduler.core.plugins.scorers_hardware import SmallestCapableScorer
from tests.unit.test_sched_filters import NOW_MS, hb, req, run, state_of

LLAMA_8B_BF16_BYTES = 16_060_000_000


def gpu_node(node_id: str, name: str, gpus: int = 1, **kw) -> NodeProfile:
    info = [
        GpuInfo(
            index=i,
            name=name,
            uuid=f"GPU-{node_id}-{i}",
            memory_total_bytes=80 << 30,
            memory_free_bytes=70 << 30,
            compute_capability="9.0",
        )
        for i in range(gpus)
    ]
    profile = NodeProfile(node_id=node_id, hostname=node_id, kind="gpu", gpus=info, cpu_count=32, **kw)
    cls = node_class(profile)
    profile.hardware_class = cls.name if cls else None
    return profile


def cpu_node(node_id: str, cores: int = 8, **kw) -> NodeProfile:
    return NodeProfile(node_id=node_id, hostname=node_id, kind="cpu", cpu_count=cores, hardware_class="cpu", **kw)


@pytest.mark.parametrize("profile_name, hardware", [("llama-3.1-8b-h100", "h100"), ("llama-3.1-8b-a100", "a100")])
@pytest.mark.parametrize("prompt_tokens", [256, 1024, 4096])
def test_the_roofline_meets_the_sims_calibrated_profiles_within_one_and_a_half(
    profile_name: str, hardware: str, prompt_tokens: int
) -> None:
    sim = get_profile(profile_name)  # BLIS's fit to measured vLLM runs of Llama-3.1-8B (bf16), one GPU
    sim_ttft_ms = sim.step_us(prompt_tokens, 0) / 1000
    sim_tpot_ms = sim.step_us(0, 1) / 1000
    est = estimate(load_table("capability"), hardware, 1, "bf16", LLAMA_8B_BF16_BYTES, prompt_tokens)
    assert est is not None
    assert 1 / 1.5 <= est.ttft_ms / sim_ttft_ms <= 1.5, (est, sim_ttft_ms)
    assert 1 / 1.5 <= est.tpot_ms / sim_tpot_ms <= 1.5, (est, sim_tpot_ms)


def test_nvml_names_map_to_their_classes_and_the_node_sums_its_gpus() -> None:
    assert gpu_class("NVIDIA A100-SXM4-80GB").name == "a100"  # type: ignore[union-attr]
    assert gpu_class("NVIDIA A100-SXM4-40GB").name == "a100-40gb"  # type: ignore[union-attr]
    assert gpu_class("NVIDIA A10").name == "a10"  # type: ignore[union-attr]
    assert gpu_class("NVIDIA H100 PCIe").name == "h100-pcie"  # type: ignore[union-attr]
    assert gpu_class("NVIDIA H100 80GB HBM3").name == "h100"  # type: ignore[union-attr]
    assert gpu_class("Tesla T4").name == "t4"  # type: ignore[union-attr]
    assert gpu_class("Some Future GPU") is None
    assert node_peak_tflops(gpu_node("n", "NVIDIA H100 80GB HBM3", gpus=4)) == 4 * 989.0
    assert node_peak_tflops(cpu_node("c", cores=8)) == pytest.approx(8 * 0.16)


def specs() -> dict[str, ModelSpec]:
    tiny = ModelSpec(name="tiny", tier="small", formats=[ModelFormat(name="onnx", weight_bytes=600_000)])
    big = ModelSpec(
        name="big",
        tier="mid",
        formats=[
            ModelFormat(name="bf16", weight_bytes=141_000_000_000),
            ModelFormat(name="awq", weight_bytes=40_000_000_000),
        ],
    )
    return {"tiny": tiny, "big": big}


def fleet_state():
    state = state_of(
        hb("cpu-w", node_id="cpu-1", models=["tiny", "big"], engine="onnx", model_format="onnx"),
        hb("a10-w", node_id="a10-1", models=["tiny", "big"], model_format="bf16"),
        hb("h100-w", node_id="h100-1", models=["tiny", "big"], model_format="bf16"),
        hb("hosted", node_id="cpu-1", models=["tiny", "big"], engine="openai-http"),
        specs=specs(),
    )
    for node in (cpu_node("cpu-1"), gpu_node("a10-1", "NVIDIA A10"), gpu_node("h100-1", "NVIDIA H100 80GB HBM3")):
        state.fleet.on_node(node)
    return state


def test_the_small_tier_may_run_on_a_cpu_node_and_the_mid_tier_may_not() -> None:
    state = fleet_state()
    flt = CapableHardwareFilter()
    assert run(flt, state, req(model="tiny", tier="small", prompt_tokens=200)) == ["a10-w", "cpu-w", "h100-w", "hosted"]
    # 141 GB of weights read per decode step: 5 s on 8 CPU cores, 0.34 s on an A10, 0.06 s on an H100 (target 0.1).
    assert run(flt, state, req(model="big", tier="mid", prompt_tokens=200)) == ["h100-w", "hosted"]
    assert run(flt, state, req(model="big", tier=None)) == ["a10-w", "cpu-w", "h100-w", "hosted"]  # no tier: not judged
    assert run(flt, state, req(model="unlisted", tier="mid")) == ["a10-w", "cpu-w", "h100-w", "hosted"]  # no formats


def test_of_the_capable_workers_the_least_powerful_scores_highest() -> None:
    state = fleet_state()
    workers = [state.fleet.workers[w] for w in ("cpu-w", "a10-w", "h100-w", "hosted")]
    scores = SmallestCapableScorer().score(state, req(model="tiny"), workers)
    assert scores["cpu-w"] == 1.0 and scores["h100-w"] == 0.0
    assert scores["cpu-w"] > scores["a10-w"] > scores["h100-w"]


def test_a_degraded_node_is_drained_of_high_priority_work_and_an_unhealthy_one_of_all() -> None:
    state = state_of(hb("a", node_id="n-a"), hb("b", node_id="n-b"), hb("c", node_id="n-c"))
    state.fleet.on_node(gpu_node("n-a", "NVIDIA A10", source="agent", health=NodeHealth.DEGRADED))
    state.fleet.on_node(gpu_node("n-b", "NVIDIA A10", source="agent", health=NodeHealth.UNHEALTHY))
    flt = NodeHealthFilter(high_priority_at_most=2)
    assert run(flt, state, req(priority=0)) == ["c"]
    assert run(flt, state, req(priority=2)) == ["c"]
    assert run(flt, state, req(priority=5)) == ["a", "c"]


def test_the_node_agent_speaks_for_its_node_over_a_workers_own_probe() -> None:
    state = state_of(hb("a", node_id="n-a"))
    state.fleet.on_node(
        gpu_node("n-a", "NVIDIA A10", source="agent", health=NodeHealth.DEGRADED, profiled_at_ms=NOW_MS)
    )
    state.fleet.on_node(cpu_node("n-a", source="worker", profiled_at_ms=NOW_MS + 60_000))
    assert state.fleet.workers["a"].hardware_class == "a10"
    assert state.fleet.workers["a"].node_health == NodeHealth.DEGRADED
    # An agent silent for longer than the limit no longer speaks for it.
    state.fleet.on_node(cpu_node("n-a", source="worker", profiled_at_ms=NOW_MS + 11 * 60_000))
    assert state.fleet.workers["a"].hardware_class == "cpu"
