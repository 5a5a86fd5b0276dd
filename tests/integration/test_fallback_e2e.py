"""A route whose target nobody serves falls back along its chain: router → scheduler → sim worker."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from llmbus.client import LlmbusClient, TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceRequest, ResultStatus
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready
from tests.support import results_then_sentinel

pytestmark = [pytest.mark.kafka, pytest.mark.redis]
DEFAULT_POLICY = Path(__file__).resolve().parents[2] / "services" / "router" / "policies" / "default.yaml"


async def test_unserved_target_falls_back_to_the_next_model(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    policy = yaml.safe_load(DEFAULT_POLICY.read_text())
    policy["models"]["big-unserved"] = {"tier": "strong", "max_model_len": 8192, "max_output_tokens": 1024}
    policy["default"] = {"target": "big-unserved", "fallback": ["sim-llama-8b"]}
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(policy))
    services.append(
        ServiceProc("llmbus_services.router", bus_settings, env={"LLMBUS_ROUTER_POLICY_PATH": str(policy_path)}).start()
    )
    services.append(
        ServiceProc("llmbus_services.scheduler", bus_settings, env={"LLMBUS_SCHEDULER_HEARTBEAT_STALE_S": "2"}).start()
    )
    services.append(
        ServiceProc(
            "llmbus_services.engine_worker",
            bus_settings,
            name="w1",
            env={"LLMBUS_WORKER_WORKER_ID": "w1", "LLMBUS_WORKER_SIM_SPEEDUP": "50"},
        ).start()
    )
    await wait_workers_ready(bus_settings, {"w1"})
    results = await TopicTail(bus_settings, t.Topics(bus_settings.topic_prefix).name(t.RESULTS)).start()
    request = InferenceRequest(request_id=uuid.uuid4().hex, prompt="no model named, so the default rule", max_tokens=8)
    async with LlmbusClient(bus_settings) as client:
        chunks = [c async for c in client.stream(request, timeout_s=90)]

        async def sentinel() -> str:  # down the same fallback
            ping = InferenceRequest(prompt="ping", max_tokens=2)
            await client.send(ping)
            return ping.request_id

        found = await results_then_sentinel(bus_settings, {request.request_id}, results, sentinel)
    await results.stop()
    assert chunks[-1].final and chunks[-1].error is None
    [result] = found[request.request_id]
    assert result.status == ResultStatus.OK and result.model == "sim-llama-8b" and result.worker_id == "w1"
    assert result.route_reason == "fallback:big-unserved->sim-llama-8b:model_unavailable"
