"""A sim worker with a host-memory KV tier, through the real stack: an evicted prefix comes back as hits."""

from __future__ import annotations

import uuid

import pytest

from llmbus.bus import decode
from llmbus.client import LlmbusClient, TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceRequest, InferenceResult, ResultStatus, WorkerStatus
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

DOC = "Kafka keeps every record in an ordered partition log. " * 45  # ~610 tokens: 38 full 16-token blocks


async def test_an_evicted_prefix_is_served_from_the_host_tier(bus_settings: BusSettings, services: list) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    services += [
        ServiceProc("llmbus_services.router", bus_settings).start(),
        ServiceProc("llmbus_services.scheduler", bus_settings).start(),
        ServiceProc(
            "llmbus_services.engine_worker",
            bus_settings,
            name="w1",
            env={
                "LLMBUS_WORKER_WORKER_ID": "w1",
                "LLMBUS_WORKER_SIM_SPEEDUP": "50",
                "LLMBUS_WORKER_SIM_KV_BLOCKS_TOTAL": "64",  # 1,024 tokens of GPU KV
                "LLMBUS_WORKER_SIM_KV_OFFLOADING_GIB": "1",  # 512 blocks of 2 MiB in host memory
            },
        ).start(),
    ]
    await wait_workers_ready(bus_settings, {"w1"})
    results = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()

    async def ask(client: LlmbusClient, prompt: str) -> InferenceResult:
        request = InferenceRequest(
            request_id=uuid.uuid4().hex, tenant="acme", model="sim-llama-8b", max_tokens=4, prompt=prompt
        )
        await client.send(request)
        async for record in results.records(60):
            result = decode(record, InferenceResult)
            if result.request_id == request.request_id:
                return result
        raise TimeoutError(f"no result for {request.request_id}")

    try:
        async with LlmbusClient(bus_settings) as client:
            first = await ask(client, DOC + " What is an offset?")
            # ~950 tokens of something else: the GPU's 64 blocks cannot keep DOC's 38 as well.
            filler = await ask(client, "Redis answers from memory, one command at a time. " * 75)
            again = await ask(client, DOC + " What is a consumer group?")
    finally:
        await results.stop()
    assert {first.status, filler.status, again.status} == {ResultStatus.OK}
    assert first.usage.cached_prompt_tokens == 0
    # Without the host tier at most the few DOC blocks the filler left on the GPU would be hits.
    full_doc_blocks = (first.usage.prompt_tokens - 8) // 16
    assert again.usage.cached_prompt_tokens >= 16 * (full_doc_blocks - 1)

    workers = await TopicTail(bus_settings, topics.name(t.WORKERS)).start()  # heartbeats come every second
    try:
        async for record in workers.records(10):
            status = decode(record, WorkerStatus)
            if status.worker_id == "w1" and status.prefix_cache_hit_rate > 0:
                assert status.kv_offload_blocks_total == 512
                break
        else:
            pytest.fail("no heartbeat from w1 with its hits")
    finally:
        await workers.stop()
