"""The router's own answers after a SIGKILL between publishing one and marking it done: never twice.

A router process (`tests.integration.router_killed_after_answer`) SIGKILLs itself right after it
published an answer of its own (a cache hit, a refusal) and before it marked the request's final
marker done; its request record stays uncommitted. A plain router then starts in the same group and is
given that record again. Pass criteria, fixed before the run: the killed router's answer is on
llm.results; once the second router has handled the record (the final marker `done:0`), llm.results
holds exactly one result for the request and its reply topic exactly one final chunk.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from llmbus.bus import Bus
from llmbus.bus.admin import ensure_catalog
from llmbus.bus.tables import read_log
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceRequest, InferenceResult, ResultStatus, RoutedRequest, TokenChunk, Usage
from llmbus.settings import BusSettings
from llmbus.state.store import dispatch_markers, redis_client
from llmbus_tools.harness.service_procs import ServiceProc, drop_namespace, fresh_settings
from tests.support import eventually, redis_keys

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow]
MODEL = "sim-llama-8b"  # max_model_len 8192 in the default policy


def deterministic(request_id: str, prompt: str) -> InferenceRequest:
    return InferenceRequest(request_id=request_id, model=MODEL, prompt=prompt, max_tokens=8, temperature=0.0)


async def results_of(settings: BusSettings, request_id: str) -> list[InferenceResult]:
    results = await read_log(settings, t.Topics(settings.topic_prefix).name(t.RESULTS), InferenceResult)
    return [result for _, result in results if result.request_id == request_id]


async def finals_of(settings: BusSettings, request_id: str) -> list[TokenChunk]:
    chunks = await read_log(settings, t.Topics(settings.topic_prefix).name(t.TOKENS), TokenChunk)
    return [chunk for _, chunk in chunks if chunk.request_id == request_id and chunk.final]


async def fill_the_cache(settings: BusSettings, bus: Bus, prompt: str) -> None:
    """A first request routed, and a worker's answer to it on llm.results: the router caches it."""
    topics = t.Topics(settings.topic_prefix)
    first = deterministic("first", prompt)
    await bus.publisher.publish(topics.name(t.REQUESTS), first, key=first.request_id)

    async def routed() -> bool:
        return any(r.request_id == "first" for _, r in await read_log(settings, topics.name(t.ROUTED), RoutedRequest))

    await eventually(routed, timeout_s=120, interval_s=0.5)
    answer = InferenceResult(
        request_id="first",
        tenant=first.tenant,
        status=ResultStatus.OK,
        model=MODEL,
        text="an answer worth keeping",
        usage=Usage(prompt_tokens=10, completion_tokens=5),
        produced_by="engine-worker",
        attempt=1,
    )
    await bus.publisher.publish(topics.name(t.RESULTS), answer, key="first")
    redis = redis_client(settings.redis_url)
    try:

        async def cached() -> bool:
            return bool(await redis_keys(redis, f"llmbus:{settings.topic_prefix}router:cache:*"))

        await eventually(cached, timeout_s=60, interval_s=0.2)
    finally:
        await redis.aclose()


@pytest.mark.parametrize("answer", ["cache_hit", "refusal"])
async def test_a_router_killed_after_its_answer_and_before_marking_it_answers_once(
    answer: str, tmp_path: Path, kafka_up: None, redis_up: None
) -> None:
    settings = fresh_settings()
    topics = t.Topics(settings.topic_prefix)
    env = {"LLMBUS_CATCH_UP_S": "2"}
    killed = ServiceProc("tests.integration.router_killed_after_answer", settings, env, tmp_path, name="killed")
    plain = ServiceProc("llmbus_services.router", settings, env, tmp_path, name="router")
    prompt = "what does the log keep? " * 4
    # A refusal: far over the model's 8,192-token window (prompt_too_long).
    request = deterministic("again", prompt if answer == "cache_hit" else "words " * 20_000)
    markers = redis_client(settings.redis_url)
    fence = dispatch_markers(markers, settings.topic_prefix)
    try:
        await ensure_catalog(settings)
        killed.start()
        bus = await Bus.start(settings, t.CLIENT, client_suffix="-crash")
        try:
            if answer == "cache_hit":
                await fill_the_cache(settings, bus, prompt)
            await bus.publisher.publish(topics.name(t.REQUESTS), request, key=request.request_id)
        finally:
            await bus.stop()
        assert killed.proc is not None
        assert await asyncio.to_thread(killed.proc.wait, 120) == -9, killed.log_tail()
        [first_answer] = await results_of(settings, request.request_id)
        assert first_answer.produced_by == "router" and first_answer.attempt == 0
        assert first_answer.cached == (answer == "cache_hit")
        assert await fence.holder(request.request_key) == "pending:0"  # published, not marked done

        plain.start()

        async def handled_again() -> bool:
            return await fence.holder(request.request_key) == "done:0"

        await eventually(handled_again, timeout_s=120, interval_s=0.5)
        await asyncio.sleep(2)  # a second answer is published before the mark: none may follow it
        results = await results_of(settings, request.request_id)
        assert len(results) == 1, [json.loads(r.model_dump_json(include={"produced_by", "cached"})) for r in results]
        assert len(await finals_of(settings, request.request_id)) == 1
    finally:
        killed.kill()
        plain.kill()
        await markers.aclose()
        await drop_namespace(settings)
