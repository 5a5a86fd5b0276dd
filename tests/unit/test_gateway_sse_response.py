"""SseResponse over plain ASGI callables: a stream that ends sends all of it, a client that hangs up
mid-stream ends the body's generator at its await (its `finally` runs) and the response returns
normally, and a cancellation from elsewhere (the server stopping) is not swallowed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from starlette.background import BackgroundTask
from starlette.types import Message

from llmbus_services.gateway.adapters.sse_response import SseResponse

SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}


class Client:
    """receive() blocks until `hang_up()`, then says http.disconnect (as uvicorn's does ever after)."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.sent: list[Message] = []

    def hang_up(self) -> None:
        self.gone.set()

    async def receive(self) -> Message:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


async def test_a_stream_that_ends_is_sent_whole_and_then_its_background_task_runs() -> None:
    client, ran = Client(), []

    async def events() -> AsyncIterator[bytes]:
        for n in range(3):
            await asyncio.sleep(0)
            yield b"data: %d\n\n" % n

    response = SseResponse(events(), media_type="text/event-stream", background=BackgroundTask(ran.append, 1))
    await asyncio.wait_for(response(SCOPE, client.receive, client.send), 5)
    assert client.sent[0]["type"] == "http.response.start" and client.sent[0]["status"] == 200
    assert client.bodies() == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert ran == [1]


async def test_a_client_that_hangs_up_mid_stream_ends_the_generator_at_its_await() -> None:
    client, ended = Client(), asyncio.Event()
    first_sent = asyncio.Event()

    async def events() -> AsyncIterator[bytes]:
        try:
            yield b"data: first\n\n"
            first_sent.set()
            await asyncio.Event().wait()  # an answer that never goes on: only the hang-up ends it
            yield b"data: never\n\n"
        finally:
            ended.set()

    serving = asyncio.ensure_future(
        SseResponse(events(), media_type="text/event-stream")(SCOPE, client.receive, client.send)
    )
    await asyncio.wait_for(first_sent.wait(), 5)
    client.hang_up()
    done, _ = await asyncio.wait({serving}, timeout=5)  # not wait_for: its own cancel would end the stream too
    assert done, "the hang-up did not end the stream"
    serving.result()  # returned, not cancelled: the stream simply ended
    assert ended.is_set()
    assert client.bodies() == [b"data: first\n\n"]
    assert serving.cancelling() == 0  # the cancel it took for the hang-up was taken back


async def test_a_cancellation_from_elsewhere_still_cancels() -> None:
    client, ended = Client(), asyncio.Event()
    started = asyncio.Event()

    async def events() -> AsyncIterator[bytes]:
        try:
            started.set()
            await asyncio.Event().wait()
            yield b""
        finally:
            ended.set()

    serving = asyncio.ensure_future(SseResponse(events())(SCOPE, client.receive, client.send))
    await asyncio.wait_for(started.wait(), 5)
    serving.cancel()  # the server stopping, not the client leaving
    with pytest.raises(asyncio.CancelledError):
        await serving
    assert ended.is_set()
