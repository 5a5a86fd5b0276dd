"""One undecodable record on a gateway's reply topic, on the real broker (the gateway's Relay).

It used to end the relay's only reply task: every request then waited the first-chunk timeout
(300 s) for a 504 while the gateway kept accepting and /ready kept saying yes.
"""

from __future__ import annotations

import asyncio

import pytest

from llmbus.bus import Bus, decode
from llmbus.bus.admin import ensure_topics
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import DeadLetter, ErrorCode, InferenceRequest, TokenChunk
from llmbus.settings import BusSettings
from llmbus_services.gateway.adapters.relay import Relay

pytestmark = pytest.mark.kafka

INSTANCE = "gw-poison"


async def test_a_bad_chunk_is_dead_lettered_ends_its_request_and_the_others_still_get_theirs(
    bus_settings: BusSettings,
) -> None:
    bus = await Bus.start(bus_settings, t.GATEWAY, client_suffix=f"-{INSTANCE}")
    reply_topic = bus.topics.replies(INSTANCE)
    await ensure_topics(bus_settings, [(reply_topic, t.REPLIES_SPEC)])
    dlq = await TopicTail(bus_settings, bus.topics.name(t.DLQ)).start()
    relay = await Relay.start(bus, TopicTail(bus_settings, reply_topic), INSTANCE)
    try:
        poisoned = await relay.open(InferenceRequest(request_id="r-poisoned", prompt="hi", max_tokens=4))
        healthy = await relay.open(InferenceRequest(request_id="r-healthy", prompt="hi", max_tokens=4))
        producer = bus.producer
        # A chunk of a newer schema: `seq` became a string.
        await asyncio.wait_for(
            producer.send_and_wait(
                reply_topic, b'{"request_id":"r-poisoned","tenant":"t","seq":"one"}', key=b"r-poisoned"
            ),
            20,
        )
        good = TokenChunk(request_id="r-healthy", tenant="t", seq=0, delta="ok", final=True, attempt=1)
        await asyncio.wait_for(producer.send_and_wait(reply_topic, good.to_bytes(), key=b"r-healthy"), 20)

        chunk = await healthy.next_chunk(20)
        assert chunk.final and chunk.delta == "ok", "the tail goes on past the bad record"
        assert relay.healthy()
        ending = await poisoned.next_chunk(20)  # now, not after the first-chunk timeout
        assert ending.final and ending.error is not None and ending.error.code == ErrorCode.INTERNAL
        assert "could not be read" in ending.error.message

        letters = [decode(r, DeadLetter) async for r in dlq.records(20) if r.key == b"r-poisoned"][:1]  # type: ignore[arg-type, attr-defined]
        assert letters and letters[0].source_topic == reply_topic
        for exchange in (poisoned, healthy):
            exchange.close()
    finally:
        await relay.stop()
        await dlq.stop()
        await bus.stop()


async def test_a_gateway_whose_reply_tail_died_is_not_ready_ends_its_waiting_requests_and_restarts_the_tail(
    bus_settings: BusSettings,
) -> None:
    """A tail that fails for a reason other than a bad record (here its consumer stopped under it) ends the
    requests waiting on it and makes the gateway unready, then runs again after a backoff: ready again,
    and a request sent after that gets its answer."""
    bus = await Bus.start(bus_settings, t.GATEWAY, client_suffix=f"-{INSTANCE}")
    reply_topic = bus.topics.replies(INSTANCE)
    await ensure_topics(bus_settings, [(reply_topic, t.REPLIES_SPEC)])
    relay = await Relay.start(bus, TopicTail(bus_settings, reply_topic), INSTANCE)
    try:
        waiting = await relay.open(InferenceRequest(request_id="r-waiting", prompt="hi", max_tokens=4))
        await relay.replies.tail.consumer.stop()  # the tail's reads now fail
        ending = await waiting.next_chunk(20)
        assert ending.final and ending.error is not None and "lost its reply stream" in ending.error.message
        assert not relay.healthy()
        waiting.close()

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while not relay.healthy() and loop.time() < deadline:
            await asyncio.sleep(0.1)
        assert relay.healthy(), "the reply tail was never started again: the gateway stays unready for good"
        assert relay.replies.restarts == 1
        later = await relay.open(InferenceRequest(request_id="r-later", prompt="hi", max_tokens=4))
        good = TokenChunk(request_id="r-later", tenant="t", seq=0, delta="back", final=True, attempt=1)
        await asyncio.wait_for(bus.producer.send_and_wait(reply_topic, good.to_bytes(), key=b"r-later"), 20)
        chunk = await later.next_chunk(20)
        assert chunk.final and chunk.delta == "back"
        later.close()
    finally:
        await relay.stop()
        await bus.stop()
