"""The client library follows the chunk contract on the real broker: a retried answer is not doubled."""

from __future__ import annotations

import asyncio

import pytest

from llmbus.bus import Bus, decode
from llmbus.client import LlmbusClient, TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceRequest
from llmbus.settings import BusSettings
from tests.unit.test_chunk_contract import RETRIED

pytestmark = [pytest.mark.kafka]


async def test_stream_text_drops_the_abandoned_attempt(bus_settings: BusSettings) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    bus = await Bus.start(bus_settings, "test")
    requests = await TopicTail(bus_settings, topics.name(t.REQUESTS)).start()

    async def play_worker() -> None:
        # Answer the first request seen with attempt 1's chunks, then attempt 2's (as after a retry).
        async for record in requests.records(30):
            request = decode(record, InferenceRequest)  # type: ignore[arg-type]
            for c in RETRIED:
                c = c.model_copy(update={"request_id": request.request_id})
                await bus.publisher.publish(topics.name(t.TOKENS), c, key=request.request_id)
            return

    worker = asyncio.create_task(play_worker())
    try:
        async with LlmbusClient(bus_settings) as client:
            updates = [u async for u in client.stream_text(InferenceRequest(prompt="hi", max_tokens=4), timeout_s=30)]
        await worker
    finally:
        await requests.stop()
        await bus.stop()
    text = ""
    for update in updates:
        text = update.delta if update.restarted else text + update.delta
    assert text == "Hello world"
    assert sum(u.restarted for u in updates) == 1 and updates[-1].final and updates[-1].chunk.attempt == 2
