"""Router + scheduler + two sim workers on the real broker and Redis: shadows and the exact cache."""

from __future__ import annotations

import uuid

import pytest

from llmbus.bus import Bus, decode
from llmbus.client import TopicTail, collect_results
from llmbus.contract import topics as t
from llmbus.contract.messages import ChatMessage, Experiment, InferenceRequest, ResultStatus, TokenChunk
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_services.router.core.cache_key import cache_key
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready
from tests.support import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


async def chunks_until_final(
    tail: TopicTail, request_id: str, seen: list[TokenChunk] | None = None, timeout_s: float = 60
) -> list[TokenChunk]:
    """The chunks of `request_id` up to its final one; every chunk read on the way is added to `seen`."""
    got: list[TokenChunk] = []
    async for record in tail.records(timeout_s):
        chunk = decode(record, TokenChunk)  # type: ignore[arg-type]
        if seen is not None:
            seen.append(chunk)
        if chunk.request_id == request_id:
            got.append(chunk)
            if chunk.final:
                break
    return got


async def test_shadow_never_reaches_the_client_and_cache_hits_stay_in_tenant(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    bus = await Bus.start(bus_settings, t.CLIENT)
    exp = Experiment(
        experiment_id="sh", kind="shadow", match_models=["sim-llama-8b"], shadow_model="sim-candidate", shadow_share=1.0
    )
    await bus.publisher.publish(topics.name(t.EXPERIMENTS), exp, key=exp.experiment_id)
    services.append(ServiceProc("llmbus_services.router", bus_settings).start())
    services.append(ServiceProc("llmbus_services.scheduler", bus_settings).start())
    for wid, model in (("w1", "sim-llama-8b"), ("w2", "sim-candidate")):
        services.append(
            ServiceProc(
                "llmbus_services.engine_worker",
                bus_settings,
                name=wid,
                env={"LLMBUS_WORKER_WORKER_ID": wid, "LLMBUS_WORKER_MODEL": model, "LLMBUS_WORKER_SIM_SPEEDUP": "50"},
            ).start()
        )
    await wait_workers_ready(bus_settings, {"w1", "w2"})
    client_tail = await TopicTail(bus_settings, topics.name(t.TOKENS)).start()
    shadow_tail = await TopicTail(bus_settings, topics.name(t.SHADOW_TOKENS)).start()
    results_tail = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    redis = redis_client(bus_settings.redis_url)
    run = uuid.uuid4().hex[:8]
    on_client_topic: list[TokenChunk] = []
    ask = InferenceRequest(
        request_id=f"{run}-a1",
        tenant="acme",
        model="sim-llama-8b",
        temperature=0.0,
        max_tokens=24,
        user_id="u1",
        messages=[ChatMessage(role="user", content="What is Kafka?")],
    )
    try:
        await bus.publisher.publish(topics.name(t.REQUESTS), ask, key=ask.request_id)
        primary = await chunks_until_final(client_tail, ask.request_id, on_client_topic)
        assert primary and primary[-1].final and primary[-1].error is None
        shadow_id = f"{ask.request_id}.shadow.sh"
        shadow = await chunks_until_final(shadow_tail, shadow_id)
        assert shadow and shadow[-1].final and shadow[-1].model == "sim-candidate"
        found = await collect_results(bus_settings, {ask.request_id, shadow_id}, timeout_s=3, tail=results_tail)
        [first] = found[ask.request_id]
        [shadow_result] = found[shadow_id]
        assert first.status == ResultStatus.OK and not first.cached and first.worker_id == "w1"
        assert shadow_result.worker_id == "w2"

        # The cache is filled from llm.results by the router.
        key = f"llmbus:{bus_settings.topic_prefix}router:cache:{cache_key(ask, 'sim-llama-8b')}"

        async def filled() -> bool:
            return bool(await redis.exists(key))

        await eventually(filled, timeout_s=20)
        again = ask.model_copy(update={"request_id": f"{run}-a2"})
        other_tenant = ask.model_copy(update={"request_id": f"{run}-g1", "tenant": "globex"})
        await bus.publisher.publish(topics.name(t.REQUESTS), again, key=again.request_id)
        hit_chunks = await chunks_until_final(client_tail, again.request_id, on_client_topic)
        await bus.publisher.publish(topics.name(t.REQUESTS), other_tenant, key=other_tenant.request_id)
        miss_chunks = await chunks_until_final(client_tail, other_tenant.request_id, on_client_topic)
        found = await collect_results(
            bus_settings, {again.request_id, other_tenant.request_id}, timeout_s=5, tail=results_tail
        )
        [hit] = found[again.request_id]
        assert hit.cached and hit.text == first.text and hit.usage.completion_tokens == first.usage.completion_tokens
        assert hit.worker_id is None and hit.produced_by == "router"
        assert "".join(c.delta for c in hit_chunks) == first.text and [c.seq for c in hit_chunks] == [0, 1]
        [miss] = found[other_tenant.request_id]
        assert not miss.cached and miss.worker_id == "w1" and len(miss_chunks) >= 2
        # Let a late shadow chunk show up on the client topic if it ever would.
        async for record in client_tail.records(1.0):
            on_client_topic.append(decode(record, TokenChunk))  # type: ignore[arg-type]
    finally:
        await redis.aclose()
        for tail in (client_tail, shadow_tail, results_tail):
            await tail.stop()
        await bus.stop()
    # Nothing of a shadow ever appeared on the client's reply topic (the shadow ran: see above).
    assert on_client_topic
    assert not [c for c in on_client_topic if c.shadow or c.request_id == shadow_id]
    assert {c.request_id for c in on_client_topic} <= {ask.request_id, again.request_id, other_tenant.request_id}
