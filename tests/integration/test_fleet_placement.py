"""A heterogeneous fleet on the real broker and Redis: node agents (one on this machine's CPUs, others on a
stand-in NVML), router and scheduler as processes, and workers of three engines.

- The small tier runs on the CPU node's onnx worker (ONNX Runtime, the tiny Llama exported here), the mid
  tier on the GPU node's sim worker: the capability filter keeps a 141 GB model off the CPU node and the
  smallest-capable scorer puts the tiny model on the CPU node though a GPU worker serves it too.
- A node whose corrected ECC errors cross its agent's threshold is drained of high-priority work; its
  low-priority work goes on.
- A LoRA adapter stays on the worker that loaded it until that worker's batch is full, then loads elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import pytest

from llmbus.bus import Bus
from llmbus.bus.tables import read_table
from llmbus.client import LlmbusClient, TopicTail, collect_results
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    InferenceRequest,
    InferenceResult,
    LoraAdapter,
    ModelFormat,
    ModelSpec,
    NodeHealth,
    NodeProfile,
    ResultStatus,
)
from llmbus.settings import BusSettings
from llmbus_services.node_agent import app as agent_app
from llmbus_services.node_agent.config import NodeAgentSettings
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready
from llmbus_tools.harness.tiny_llama import build_tiny_llama
from llmbus_tools.harness.tiny_onnx import export_tiny_onnx
from tests.fixtures.fake_nvml import FakeGpu, make_fake_nvml

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(900)]

H100 = "NVIDIA H100 80GB HBM3"


@contextlib.asynccontextmanager
async def node_agent(
    settings: BusSettings, node_id: str, nvml: ModuleType | None, **cfg: float
) -> AsyncIterator[asyncio.Task[None]]:
    """The node agent in this process (its NVML a stand-in where given), its first profile published."""
    stop = asyncio.Event()
    agent = NodeAgentSettings(node_id=node_id, interval_s=cfg.pop("interval_s", 1.0), **cfg)
    task = asyncio.create_task(agent_app.main(settings, stop, nvml=nvml, agent_settings=agent))
    try:
        await until_node(settings, node_id, lambda p: p.source == "agent")
        yield task
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)


async def until_node(settings: BusSettings, node_id: str, ok, timeout_s: float = 60) -> NodeProfile:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        table = await read_table(settings, t.Topics(settings.topic_prefix).name(t.NODES), NodeProfile, timeout_s=10)
        profile = table.get(node_id)
        if profile is not None and ok(profile):
            return profile
        assert asyncio.get_running_loop().time() < deadline, f"node {node_id}: {profile}"
        await asyncio.sleep(0.3)


async def publish_models(settings: BusSettings, *specs: ModelSpec) -> None:
    bus = await Bus.start(settings, t.CLIENT)
    try:
        for spec in specs:
            await bus.publisher.publish(bus.topics.name(t.MODELS), spec, key=spec.name)
    finally:
        await bus.stop()


def worker(settings: BusSettings, services: list[ServiceProc], worker_id: str, node_id: str, **env: str) -> None:
    full = {"LLMBUS_WORKER_WORKER_ID": worker_id, "LLMBUS_WORKER_NODE_ID": node_id, "LLMBUS_WORKER_DRAIN_GRACE_S": "1"}
    full |= {f"LLMBUS_WORKER_{k.upper()}": v for k, v in env.items()}
    services.append(ServiceProc("llmbus_services.engine_worker", settings, name=worker_id, env=full).start())


def router_and_scheduler(settings: BusSettings, services: list[ServiceProc]) -> None:
    services.append(ServiceProc("llmbus_services.router", settings).start())
    services.append(ServiceProc("llmbus_services.scheduler", settings).start())


async def ask(settings: BusSettings, requests: list[InferenceRequest], timeout_s: float = 120) -> list[InferenceResult]:
    """Send `requests` together; their results, in the order sent."""
    ids = {r.request_id for r in requests}
    tail = await TopicTail(settings, t.Topics(settings.topic_prefix).name(t.RESULTS)).start()
    try:
        async with LlmbusClient(settings) as client:
            for request in requests:
                await client.send(request)
        found = await collect_results(settings, ids, timeout_s, tail, until=lambda f: ids <= set(f))
    finally:
        await tail.stop()
    assert ids <= set(found), f"no result for {sorted(ids - set(found))}"
    return [found[r.request_id][0] for r in requests]


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_tiny_onnx(build_tiny_llama(), tmp_path_factory.mktemp("onnx") / "tiny-llama-onnx")


@pytest.fixture(scope="module")
def onnx_bytes(onnx_dir: Path) -> int:
    """The exported weights' size: what the capability filter prices the onnx format by."""
    return sum(f.stat().st_size for f in onnx_dir.glob("model.onnx*"))


async def test_the_small_tier_runs_on_the_cpu_nodes_onnx_worker_and_the_mid_tier_on_a_gpu(
    bus_settings: BusSettings, services: list[ServiceProc], onnx_dir: Path, onnx_bytes: int
) -> None:
    await publish_models(
        bus_settings,
        ModelSpec(
            name="tiny",
            tier="small",
            max_model_len=512,
            max_output_tokens=64,
            formats=[
                ModelFormat(name="onnx", weight_bytes=onnx_bytes),
                ModelFormat(name="bf16", weight_bytes=onnx_bytes // 2),
            ],
        ),
        ModelSpec(name="mid-llm", tier="mid", formats=[ModelFormat(name="bf16", weight_bytes=141_000_000_000)]),
    )
    async with (
        node_agent(bus_settings, "fleet-cpu-1", None),  # this machine's CPUs (no NVML here)
        node_agent(bus_settings, "fleet-gpu-1", make_fake_nvml([FakeGpu(name=H100)])),
    ):
        router_and_scheduler(bus_settings, services)
        onnx = {"engine": "onnx", "model": "tiny", "onnx_model_path": str(onnx_dir), "onnx_ignore_eos": "true"}
        worker(bus_settings, services, "onnx-cpu", "fleet-cpu-1", **onnx)
        worker(bus_settings, services, "sim-gpu-tiny", "fleet-gpu-1", model="tiny", sim_speedup="10")
        worker(bus_settings, services, "sim-gpu-mid", "fleet-gpu-1", model="mid-llm", sim_speedup="10")
        worker(bus_settings, services, "sim-cpu-mid", "fleet-cpu-1", model="mid-llm", sim_speedup="10")
        await wait_workers_ready(bus_settings, {"onnx-cpu", "sim-gpu-tiny", "sim-gpu-mid", "sim-cpu-mid"}, 240)
        # Answered once the scheduler runs: it has read the fleet topics (a scheduler places by the heartbeats
        # and profiles it has read so far; a node not yet read is of unknown hardware, which is not judged).
        await ask(
            bus_settings, [InferenceRequest(model=m, prompt="warm up", max_tokens=1) for m in ("tiny", "mid-llm")]
        )

        small = []
        for i in range(5):  # one after the other: each finds the fleet idle, as the small tier's traffic would
            prompt = f"kafka broker {i} holds the topic partition"
            small += await ask(
                bus_settings, [InferenceRequest(model="tiny", prompt=prompt, max_tokens=8, temperature=0)]
            )
        mid = await ask(
            bus_settings, [InferenceRequest(model="mid-llm", prompt=f"plan {i}", max_tokens=8) for i in range(5)]
        )
    assert all(r.status == ResultStatus.OK for r in small + mid), [r.error for r in small + mid]
    assert {(r.worker_id, r.node_id, r.gpu, r.model_format) for r in small} == {
        ("onnx-cpu", "fleet-cpu-1", None, "onnx")
    }
    assert all(r.usage.completion_tokens == 8 and r.text for r in small)
    assert {(r.worker_id, r.node_id, r.gpu) for r in mid} == {("sim-gpu-mid", "fleet-gpu-1", H100)}


async def test_an_ecc_crossing_drains_high_priority_work_from_the_node(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    failing = FakeGpu(name="NVIDIA A10", ecc={(0, 0): 0, (1, 0): 0, (0, 1): 0, (1, 1): 0})
    await publish_models(bus_settings, ModelSpec(name="gpu-model"))
    async with (
        node_agent(bus_settings, "ecc-1", make_fake_nvml([failing]), interval_s=0.5, ecc_corrected_degraded_above=20),
        node_agent(bus_settings, "ecc-2", make_fake_nvml([FakeGpu(name="NVIDIA A10")]), interval_s=0.5),
    ):
        router_and_scheduler(bus_settings, services)
        for node in ("ecc-1", "ecc-2"):
            worker(bus_settings, services, f"w-{node}", node, model="gpu-model", sim_speedup="1")
        await wait_workers_ready(bus_settings, {"w-ecc-1", "w-ecc-2"}, 120)

        def burst(priority: int, tag: str) -> list[InferenceRequest]:
            return [
                InferenceRequest(model="gpu-model", prompt=f"{tag} {i}", max_tokens=60, priority=priority)
                for i in range(6)
            ]

        before = await ask(bus_settings, burst(0, "before"))
        failing.ecc = {(0, 0): 21, (1, 0): 0, (0, 1): 21, (1, 1): 0}  # single-bit errors over the threshold
        await until_node(bus_settings, "ecc-1", lambda p: p.health == NodeHealth.DEGRADED)
        await asyncio.sleep(2.0)  # the scheduler follows llm.nodes: its next record is read well within this
        urgent = await ask(bus_settings, burst(0, "urgent"))
        batch = await ask(bus_settings, burst(9, "batch"))
    assert {r.node_id for r in before} == {"ecc-1", "ecc-2"}  # both took high-priority work while healthy
    assert {r.node_id for r in urgent} == {"ecc-2"}  # drained of high-priority work
    assert "ecc-1" in {r.node_id for r in batch}  # low-priority work still runs there
    assert all(r.status == ResultStatus.OK for r in before + urgent + batch)


async def test_an_adapter_stays_where_it_is_loaded_until_that_worker_is_full(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    sql = LoraAdapter(name="base-sql", base_model="base", source="/adapters/sql", rank=8)
    await publish_models(bus_settings, ModelSpec(name="base"), ModelSpec(name="base-sql", lora=sql))
    router_and_scheduler(bus_settings, services)
    lora = {"model": "base", "sim_max_loras": "1", "sim_max_num_seqs": "2", "sim_lora_load_ms": "300"}
    for wid in ("lora-a", "lora-b"):
        worker(bus_settings, services, wid, f"node-{wid}", sim_speedup="1", **lora)
    await wait_workers_ready(bus_settings, {"lora-a", "lora-b"}, 120)

    (first,) = await ask(bus_settings, [InferenceRequest(model="base-sql", prompt="warm the adapter", max_tokens=4)])
    loaded_on = first.worker_id
    one_by_one = []
    for i in range(4):  # each alone: the adapter's worker has room every time
        one_by_one += await ask(bus_settings, [InferenceRequest(model="base-sql", prompt=f"q{i}", max_tokens=4)])
    # Three at once, long: two fill the loaded worker's batch (max_num_seqs 2), the third loads it elsewhere.
    together = await ask(
        bus_settings, [InferenceRequest(model="base-sql", prompt=f"long {i}", max_tokens=200) for i in range(3)]
    )
    assert {r.worker_id for r in one_by_one} == {loaded_on}
    assert sorted(r.worker_id == loaded_on for r in together) == [False, True, True]
    assert all(r.model == "base-sql" and r.status == ResultStatus.OK for r in [first, *one_by_one, *together])
