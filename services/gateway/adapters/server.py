"""The gateway's HTTP server config: uvicorn, with a deadline on a request's headers.

uvicorn bounds the wait between requests on a kept-alive connection (`timeout_keep_alive`) but
not the headers of a request: a client that sends them a byte at a time (slowloris) holds its
connection, and a file descriptor, for as long as it likes. The body has its own deadline where
it is read (http.read_json), since only the app knows when it has read all of it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from llmbus_services.gateway.config import GatewaySettings


def header_deadline_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, closing a connection whose next request's headers take over `header_timeout_s`."""
    base: Any = AutoHTTPProtocol  # httptools' protocol where installed, else h11's (both keep `cycle`)

    class HeaderDeadlineProtocol(base):  # type: ignore[misc, valid-type]
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            # Armed first: a pipelined request that super() starts makes a new cycle, which disarms it.
            self._arm_header_deadline()
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            # The cycle of now: a request whose headers are complete replaces it.
            self._header_deadline = self.loop.call_later(header_timeout_s, self._headers_overdue, self.cycle)

        def _headers_overdue(self, cycle_when_armed: object) -> None:
            if self.cycle is cycle_when_armed and not self.transport.is_closing():
                self.transport.close()

    return HeaderDeadlineProtocol


def server_config(app: Any, settings: GatewaySettings, stop_timeout_s: float) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=int(stop_timeout_s),
        http=header_deadline_protocol(settings.header_timeout_s),
    )
