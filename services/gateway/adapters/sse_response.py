"""A streaming response that hears its client hang up without a task group.

Starlette's StreamingResponse, under a server of ASGI spec 2.3 (uvicorn's), sends the body and listens
for the disconnect in two tasks of an anyio task group, and cancels the one left when the other ends:
per response a task group, a task and anyio's cancellation, delivered again every loop turn until it
is taken (`CancelScope._deliver_cancellation`). Here the body is sent from the request's own task, and
one waiter on `receive()` cancels that task if the client leaves first. The body's generator sees the
same thing as under Starlette's: a CancelledError at the await it was in, so its `finally` runs (the
gateway then cancels the request on llm.control).
"""

from __future__ import annotations

import asyncio

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


async def client_gone(receive: Receive) -> None:
    """Returns when the client has gone. Once the request body has been read, the next ASGI message
    is the disconnect: one waiter per request hears it, where polling costs a call every fraction of
    a second."""
    while (await receive())["type"] != "http.disconnect":
        pass


class SseResponse(StreamingResponse):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        streaming, hung_up = True, False

        def end_stream(gone: asyncio.Future[None]) -> None:
            nonlocal hung_up
            if streaming and not gone.cancelled() and gone.exception() is None:
                hung_up = True
                task.cancel()

        gone = asyncio.ensure_future(client_gone(receive))
        gone.add_done_callback(end_stream)
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not hung_up:
                raise  # cancelled from elsewhere (the server stopping)
            task.uncancel()  # the client left: the stream ends here, as Starlette's would
        finally:
            streaming = False
            gone.cancel()
        if self.background is not None:
            await self.background()
