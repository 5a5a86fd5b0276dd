"""What no client can make the gateway hold (the gateway's app, its uvicorn server and Relay on the real
broker; the test plays the worker by writing the reply topic itself):

- headers or a body sent a byte at a time (slowloris): the connection ends at a deadline;
- a client that hangs up before its first chunk: its slot is free and its request cancelled now,
  not after the first-chunk timeout;
- a non-streaming answer that stalls: the documented 504, not a 500;
- `llmbus_gateway_requests_total` by route, never by the raw path a client chose.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client import generate_latest

from llmbus.bus import Bus, decode
from llmbus.bus.admin import ensure_topics
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import Control, ControlAction, TokenChunk
from llmbus.settings import BusSettings
from llmbus_services.gateway.adapters.catalog import CatalogFollower, ModelCatalog
from llmbus_services.gateway.adapters.relay import Relay
from llmbus_services.gateway.adapters.server import server_config
from llmbus_services.gateway.app import _Server
from llmbus_services.gateway.config import GatewaySettings
from llmbus_services.gateway.handlers import Gateway, create_app
from llmbus_tools.harness.ports import free_port
from tests.support import eventually

pytestmark = pytest.mark.kafka

INSTANCE = "gw-limits"
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class Front:
    base_url: str
    port: int
    relay: Relay
    bus: Bus
    reply_topic: str

    async def request_ids(self) -> list[str]:
        return [key.decode() for key in self.relay.replies.queues]


@pytest.fixture
async def front(bus_settings: BusSettings) -> AsyncIterator[Front]:
    settings = GatewaySettings(
        port=free_port(),
        instance_id=INSTANCE,
        require_api_key=False,
        header_timeout_s=1.0,
        body_timeout_s=1.0,
        first_chunk_timeout_s=300.0,  # as deployed: a hang-up must not have to wait for it
        chunk_gap_timeout_s=1.0,
        disconnect_poll_s=0.05,
    )
    bus = await Bus.start(bus_settings, t.GATEWAY, client_suffix=f"-{INSTANCE}")
    reply_topic = bus.topics.replies(INSTANCE)
    await ensure_topics(bus_settings, [(reply_topic, t.REPLIES_SPEC)])
    relay = await Relay.start(bus, INSTANCE)
    catalog = ModelCatalog(settings.worker_stale_s)
    # Not started: /ready is not what these tests ask.
    follower = CatalogFollower(bus_settings, catalog, bus.dead_letter)
    gateway = Gateway(settings, relay, None, catalog, follower)
    server = _Server(server_config(create_app(gateway), settings, stop_timeout_s=2))
    serving = asyncio.create_task(server.serve())

    async def started() -> bool:
        return server.started

    await eventually(started, timeout_s=10, interval_s=0.02)
    try:
        yield Front(f"http://127.0.0.1:{settings.port}", settings.port, relay, bus, reply_topic)
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serving, 10)
        await follower.stop()
        await relay.stop()
        await bus.stop()


async def closed_by_server(port: int, sent: bytes, within_s: float) -> bool:
    """Send `sent` (part of a request) and wait: True if the server ends the connection in time."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(sent)
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            while True:  # a 408 may come first; the end of the stream is what counts
                if not await asyncio.wait_for(reader.read(4096), within_s):
                    return True
        return False
    finally:
        writer.close()


async def test_headers_sent_slowly_end_the_connection(front: Front) -> None:
    partial = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl"
    assert await closed_by_server(front.port, partial, within_s=5)


async def test_a_body_sent_slowly_ends_the_request(front: Front) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
    try:
        writer.write(head + b'{"model": ')
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 5)
        assert status_line.split()[1] == b"408", status_line
    finally:
        writer.close()
    assert front.relay.in_flight == 0


async def test_a_client_that_hangs_up_before_its_first_chunk_frees_its_slot_now(
    front: Front, bus_settings: BusSettings
) -> None:
    control = await TopicTail(bus_settings, front.bus.topics.name(t.CONTROL)).start()
    try:
        async with httpx.AsyncClient(base_url=front.base_url) as http:
            posting = asyncio.create_task(http.post("/v1/chat/completions", json=CHAT, timeout=60))

            async def in_flight() -> bool:
                return front.relay.in_flight == 1

            await eventually(in_flight, timeout_s=10, interval_s=0.02)
            [request_id] = await front.request_ids()
            posting.cancel()  # the client hangs up; no chunk ever came
            with contextlib.suppress(asyncio.CancelledError):
                await posting

        async def freed() -> bool:
            return front.relay.in_flight == 0

        await eventually(freed, timeout_s=5, interval_s=0.05)
        cancels = [
            decode(r, Control)  # type: ignore[arg-type]
            async for r in control.records(10)
            if r.key.split(b":", 1)[-1] == request_id.encode()  # type: ignore[attr-defined]  # `<tenant>:<id>`
        ][:1]
        assert cancels and cancels[0].action == ControlAction.CANCEL
    finally:
        await control.stop()


async def test_a_stalled_answer_is_a_504(front: Front) -> None:
    async with httpx.AsyncClient(base_url=front.base_url) as http:
        posting = asyncio.create_task(http.post("/v1/chat/completions", json=CHAT, timeout=60))

        async def opened() -> bool:
            return len(await front.request_ids()) == 1

        await eventually(opened, timeout_s=10, interval_s=0.02)
        [request_id] = await front.request_ids()
        first = TokenChunk(request_id=request_id, tenant="default", seq=0, delta="he", attempt=1)
        await asyncio.wait_for(
            front.bus.producer.send_and_wait(front.reply_topic, first.to_bytes(), key=request_id.encode()), 20
        )
        response = await asyncio.wait_for(posting, 30)  # then nothing: chunk_gap_timeout_s passes
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "timeout"


async def test_request_counts_are_labelled_by_route_not_by_raw_path(front: Front) -> None:
    minted = f"minted-{uuid.uuid4().hex}"
    async with httpx.AsyncClient(base_url=front.base_url) as http:
        assert (await http.get(f"/v1/models/{minted}")).status_code == 404
        assert (await http.post(f"/v1/{minted}", json=CHAT)).status_code == 404
    exposed = generate_latest().decode()
    assert minted not in exposed
    assert 'llmbus_gateway_requests_total{endpoint="/v1/models/{model:path}",status="404"}' in exposed


async def test_a_gateway_without_its_reply_tail_refuses_new_requests(front: Front) -> None:
    await front.relay.replies.tail.consumer.stop()  # the tail's reads now fail: its task ends with an error

    async def tail_gone() -> bool:
        return not front.relay.healthy()

    await eventually(tail_gone, timeout_s=10, interval_s=0.05)
    async with httpx.AsyncClient(base_url=front.base_url) as http:
        refused = await http.post("/v1/chat/completions", json=CHAT, timeout=10)
        ready = await http.get("/ready", timeout=10)
    assert refused.status_code == 503 and "reply stream" in refused.text, "not accepted, to wait 300 s for a 504"
    assert ready.status_code == 503 and ready.json()["reply_tail"] is False
    assert front.relay.in_flight == 0
