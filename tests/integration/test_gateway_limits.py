"""What no client can make the gateway hold (the gateway's app, its uvicorn server and Relay on the real
broker; the test plays the worker by writing the reply topic itself):

- headers or a body sent a byte at a time (slowloris): the connection ends at a deadline;
- a client that hangs up before its first chunk: its slot is free and its request cancelled now,
  not after the first-chunk timeout;
- a non-streaming answer that stalls: the documented 504, not a 500;
- `llmbus_gateway_requests_total` by route, never by the raw path a client chose;
- a revoked API key, though remembered for `api_key_cache_s`, is refused once that time is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
import redis.asyncio as redis
from prometheus_client import generate_latest

from llmbus.bus import Bus, decode
from llmbus.bus.admin import ensure_topics
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import Control, ControlAction, TokenChunk
from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.settings import BusSettings
from llmbus_services.gateway.adapters.catalog import ModelCatalog
from llmbus_services.gateway.adapters.relay import Relay
from llmbus_services.gateway.adapters.server import server_config
from llmbus_services.gateway.app import _Server
from llmbus_services.gateway.config import GatewaySettings
from llmbus_services.gateway.flows import Gateway, create_app
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


@contextlib.asynccontextmanager
async def serving_front(
    bus_settings: BusSettings, keys: ApiKeyStore | None = None, **more: object
) -> AsyncIterator[Front]:
    """The gateway's app on its uvicorn server and Relay, with these settings over the tests' defaults."""
    defaults: dict[str, object] = {
        "require_api_key": keys is not None,
        "header_timeout_s": 1.0,
        "body_timeout_s": 1.0,
        "first_chunk_timeout_s": 300.0,  # as deployed: a hang-up must not have to wait for it
        "chunk_gap_timeout_s": 1.0,
    }
    settings = GatewaySettings(port=free_port(), instance_id=INSTANCE, **(defaults | more))  # type: ignore[arg-type]
    bus = await Bus.start(bus_settings, t.GATEWAY, client_suffix=f"-{INSTANCE}")
    reply_topic = bus.topics.replies(INSTANCE)
    await ensure_topics(bus_settings, [(reply_topic, t.REPLIES_SPEC)])
    relay = await Relay.start(bus, TopicTail(bus_settings, reply_topic), INSTANCE)
    catalog = ModelCatalog(settings.worker_stale_s)
    gateway = Gateway(settings, relay, keys, catalog, asyncio.Event())  # /ready is not what these tests ask
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
        await relay.stop()
        await bus.stop()


@pytest.fixture
async def front(bus_settings: BusSettings) -> AsyncIterator[Front]:
    async with serving_front(bus_settings) as serving:
        yield serving


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


async def test_a_gateway_without_its_reply_tail_refuses_new_requests_until_the_tail_runs_again(front: Front) -> None:
    front.relay.replies.restart_first_s = 3.0  # the first restart after 3 s: time to look while it is down
    await front.relay.replies.tail.consumer.stop()  # the tail's reads now fail

    async def tail_gone() -> bool:
        return not front.relay.healthy()

    await eventually(tail_gone, timeout_s=10, interval_s=0.05)
    async with httpx.AsyncClient(base_url=front.base_url) as http:
        refused = await http.post("/v1/chat/completions", json=CHAT, timeout=10)
        ready = await http.get("/ready", timeout=10)
        assert refused.status_code == 503 and "reply stream" in refused.text, "not accepted, to wait 300 s for a 504"
        assert ready.status_code == 503 and ready.json()["reply_tail"] is False
        assert front.relay.in_flight == 0

        async def tail_back() -> bool:
            return front.relay.healthy()

        await eventually(tail_back, timeout_s=20, interval_s=0.1)
        again = (await http.get("/ready", timeout=10)).json()
    assert again["reply_tail"] is True, "readiness follows the restarted tail"


async def test_a_request_over_the_bus_limit_is_a_413_not_a_retryable_503(front: Front) -> None:
    """A body within MAX_BODY_BYTES (4 MiB) whose request is over the bus's record limit (1 MiB less headroom)
    can never be carried: a final 413, never a 503 with Retry-After that SDKs retry."""
    limit_bytes = front.bus.settings.max_request_bytes
    big = {"model": "auto", "messages": [{"role": "user", "content": "y" * 1_500_000}]}
    async with httpx.AsyncClient(base_url=front.base_url) as http:
        response = await http.post("/v1/chat/completions", json=big, timeout=30)
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "request_too_large" and str(limit_bytes) in response.text
    assert "retry-after" not in response.headers
    assert front.relay.in_flight == 0 and not await front.request_ids()


async def test_one_tenant_holds_at_most_its_share_of_the_slots_and_the_others_still_get_in(
    bus_settings: BusSettings, client: redis.Redis
) -> None:
    keys = ApiKeyStore(client, gateway_key_namespace(bus_settings.topic_prefix))
    acme, _ = await keys.create("acme")
    globex, _ = await keys.create("globex")
    async with (
        serving_front(bus_settings, keys, max_in_flight=8, max_in_flight_per_tenant=2) as front,
        httpx.AsyncClient(base_url=front.base_url) as http,
    ):

        def post(key: str) -> asyncio.Task[httpx.Response]:
            headers = {"authorization": f"Bearer {key}"}
            return asyncio.create_task(http.post("/v1/chat/completions", json=CHAT, headers=headers, timeout=60))

        waiting = [post(acme), post(acme)]  # no worker answers: both hold their slot

        async def acme_full() -> bool:
            return len(await front.request_ids()) == 2

        await eventually(acme_full, timeout_s=10, interval_s=0.02)
        third = await asyncio.wait_for(post(acme), 10)
        assert third.status_code == 429, third.text
        assert third.json()["error"]["code"] == "rate_limit_exceeded" and int(third.headers["retry-after"]) >= 1
        waiting.append(post(globex))

        async def globex_in() -> bool:
            return len(await front.request_ids()) == 3

        await eventually(globex_in, timeout_s=10, interval_s=0.02)
        assert front.relay.in_flight_of("globex") == 1 and front.relay.in_flight_of("acme") == 2
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

        async def freed() -> bool:
            return front.relay.in_flight == 0 and front.relay.in_flight_of("acme") == 0

        await eventually(freed, timeout_s=10, interval_s=0.05)
    await client.delete(*[k async for k in client.scan_iter(match=f"llmbus:{bus_settings.topic_prefix}gateway:*")])


async def test_a_revoked_key_is_refused_within_the_key_cache_time(
    bus_settings: BusSettings, client: redis.Redis
) -> None:
    keys = ApiKeyStore(client, gateway_key_namespace(bus_settings.topic_prefix))
    secret, made = await keys.create("acme")
    cache_s = 1.0
    async with (
        serving_front(bus_settings, keys, api_key_cache_s=cache_s) as front,
        httpx.AsyncClient(base_url=front.base_url, headers={"authorization": f"Bearer {secret}"}) as http,
    ):
        assert (await http.get("/v1/models", timeout=10)).status_code == 200  # looked up, and remembered
        assert await keys.revoke(made.key_id)
        revoked_at = time.monotonic()

        async def refused() -> bool:
            return (await http.get("/v1/models", timeout=10)).status_code == 401

        await eventually(refused, timeout_s=10, interval_s=0.05)
        refused_after_s = time.monotonic() - revoked_at
    assert refused_after_s <= cache_s + 1.0, f"a revoked key worked {refused_after_s:.2f}s on"
    assert not [k async for k in client.scan_iter(match=f"llmbus:{bus_settings.topic_prefix}gateway:*")]
