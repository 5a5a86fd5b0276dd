"""LlmbusClient's streams share one reply tail per topic, also when they start together (real broker).

Eight streams started at once used to start eight tails of llm.tokens: the client kept the last
and never stopped the other seven (the e2e experiment test's 7 unclosed consumers per CI run).
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer

from llmbus.client import LlmbusClient
from llmbus.contract import topics as t
from llmbus.settings import BusSettings

pytestmark = pytest.mark.kafka


async def test_streams_started_together_share_one_tail_and_it_is_stopped(
    bus_settings: BusSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[AIOKafkaConsumer] = []

    class Recorded(AIOKafkaConsumer):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(self)

    monkeypatch.setattr("llmbus.bus.tail.AIOKafkaConsumer", Recorded)
    topic = t.Topics(bus_settings.topic_prefix).name(t.TOKENS)
    async with LlmbusClient(bus_settings) as client:
        routers = await asyncio.gather(*[client._reply_router(topic) for _ in range(8)])
        assert len({id(r) for r in routers}) == 1
    assert len(made) == 1 and made[0]._closed is True
