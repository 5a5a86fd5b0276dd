"""The node agent on the real broker: its profile on llm.nodes and its gauges on Prometheus's /metrics (as a
process, on this machine's CPUs), an engine-worker on a GPU node taking its node agent's profile (a stand-in
NVML) instead of probing alone, and `llmbus status --nodes` showing the fleet by hardware class."""

from __future__ import annotations

import asyncio
import os
import sys

import httpx
import pytest

from llmbus.bus.tables import read_table
from llmbus.contract import topics as t
from llmbus.contract.messages import NodeHealth, WorkerStatus
from llmbus.process.launch import bus_env
from llmbus.settings import BusSettings
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready
from tests.fixtures.fake_nvml import FakeGpu, make_fake_nvml
from tests.integration.test_fleet_placement import node_agent, until_node, worker

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(600)]

A100 = "NVIDIA A100-SXM4-80GB"


async def metrics_text(port: int, timeout_s: float = 60) -> str:
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with httpx.AsyncClient() as http:
        while True:
            try:
                response = await http.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
                if "llmbus_node_info" in response.text:
                    return response.text
            except httpx.HTTPError:
                pass
            assert asyncio.get_running_loop().time() < deadline, "no node gauges on /metrics"
            await asyncio.sleep(0.5)


async def test_the_agents_profile_and_gauges_and_the_fleet_by_hardware_class(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    port = free_port()
    env = {
        "LLMBUS_NODE_AGENT_NODE_ID": "agent-cpu",
        "LLMBUS_NODE_AGENT_INTERVAL_S": "1",
        "LLMBUS_METRICS_PORT": str(port),
    }
    services.append(ServiceProc("llmbus_services.node_agent", bus_settings, env=env).start())
    cpu = await until_node(bus_settings, "agent-cpu", lambda p: p.source == "agent")
    assert (cpu.kind, cpu.hardware_class, cpu.health) == ("cpu", "cpu", NodeHealth.OK)
    assert cpu.peak_tflops == pytest.approx(0.16 * (os.cpu_count() or 1)) and cpu.memory_total_bytes > 0
    text = await metrics_text(port)
    assert 'node="agent-cpu"' in text and 'hardware_class="cpu"' in text and 'source="agent"' in text
    assert 'llmbus_node_health{node="agent-cpu",state="ok"} 1.0' in text
    assert 'llmbus_node_memory_bytes{Hostname="' in text

    gpus = make_fake_nvml([FakeGpu(name=A100, cc=(8, 0), uuid=f"GPU-{i}") for i in range(2)])
    async with node_agent(bus_settings, "agent-gpu", gpus):
        worker(bus_settings, services, "w-gpu", "agent-gpu", model="m", sim_speedup="10")
        await wait_workers_ready(bus_settings, {"w-gpu"}, 120)
        table = await read_table(bus_settings, t.Topics(bus_settings.topic_prefix).name(t.WORKERS), WorkerStatus)
        # This machine has no GPU: formats for compute capability 8.0 come from the agent's profile alone.
        assert set(table["w-gpu"].formats_supported) >= {"bf16", "fp16", "awq", "gptq"}
        gpu = await until_node(bus_settings, "agent-gpu", lambda p: p.source == "agent")
        assert gpu.hardware_class == "a100" and gpu.peak_tflops == 2 * 312.0
        cli = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "llmbus.cli.main",
            "status",
            "--nodes",
            env=os.environ | bus_env(bus_settings) | {"COLUMNS": "250"},
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(cli.communicate(), 120)
        assert cli.returncode == 0
        shown = out.decode()
    assert "nodes by hardware class" in shown
    rows = {line.split()[0]: line for line in shown.splitlines() if line.strip().startswith(("a100", "cpu"))}
    assert "agent-gpu" in rows["a100"] and f"2 x {A100}" in rows["a100"] and "w-gpu" in rows["a100"]
    assert "624" in rows["a100"] and "550.54.15" in rows["a100"] and "ok" in rows["a100"]
    assert "agent-cpu" in rows["cpu"]
