"""The project's own HTTP load driver for OpenAI-compatible servers: closed-loop streaming chat requests.

Each of `concurrency` clients keeps one HTTP/1.1 keep-alive connection and sends its next request
as soon as the last one ended. Raw asyncio streams and httptools' response parser (no HTTP
framework), so the driver's own CPU stays small next to what it measures on a shared machine. For
every request: the time to the first SSE event carrying text (first token), the time to the end
of the response (final), the tokens of the text (words: the upstream's tokens are " w0 w1 ..."),
and an error when the status is not 200, the
stream carries an error event, or fewer tokens came than asked for.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools


@dataclass
class Sample:
    first_token_ms: float | None
    final_ms: float | None
    tokens: int
    error: str | None


@dataclass
class _Response:
    status: int = 0
    buffer: bytes = b""
    first_token_s: float | None = None
    tokens: int = 0
    error: str | None = None
    complete: asyncio.Event = field(default_factory=asyncio.Event)

    # httptools callbacks
    def on_status(self, _: bytes) -> None:
        pass

    def on_body(self, data: bytes) -> None:
        self.buffer += data
        *events, self.buffer = self.buffer.split(b"\n\n")
        for event in events:
            self._event(event)

    def on_message_complete(self) -> None:
        if self.buffer.strip():
            self._event(self.buffer)
            self.buffer = b""
        self.complete.set()

    def _event(self, event: bytes) -> None:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue  # comments (keep-alives), event names
            data = line[5:].strip()
            if data == b"[DONE]":
                continue
            try:
                obj = json.loads(data)
            except ValueError:
                self.error = self.error or "bad SSE data"
                continue
            if "error" in obj:
                self.error = self.error or f"error event: {str(obj['error'])[:80]}"
            for choice in obj.get("choices") or ():
                text = (choice.get("delta") or {}).get("content") or choice.get("text")
                if text:
                    # A gateway may put several tokens in one event (llmbus's chunks): the upstream's
                    # tokens are words (" w0 w1 ..."), so the words of the text are its tokens.
                    self.tokens += len(text.split())
                    if self.first_token_s is None:
                        self.first_token_s = time.perf_counter()


class Connection:
    """One keep-alive connection; reconnects when the server closed it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    async def post(
        self, path: str, body: bytes, headers: dict[str, str], timeout_s: float, response: _Response | None = None
    ) -> tuple[float, _Response]:
        """(perf_counter at the send, the response); `response`: one of a subclass (its own callbacks)."""
        if self._writer is None or self._writer.is_closing():
            await self._open()
        assert self._reader is not None and self._writer is not None
        head = f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\ncontent-type: application/json\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head += f"content-length: {len(body)}\r\n\r\n"
        response = _Response() if response is None else response
        parser = httptools.HttpResponseParser(response)
        started = time.perf_counter()
        self._writer.write(head.encode() + body)
        try:
            async with asyncio.timeout(timeout_s):
                while not response.complete.is_set():
                    data = await self._reader.read(65536)
                    if not data:
                        raise ConnectionResetError("server closed the connection")
                    parser.feed_data(data)
        except (OSError, TimeoutError, httptools.HttpParserError) as exc:
            await self.close()
            response.error = response.error or type(exc).__name__
            return started, response
        response.status = parser.get_status_code()
        if not parser.should_keep_alive():
            await self.close()
        return started, response


def chat_body(model: str, tokens: int, tag: str, i: int) -> bytes:
    """A unique prompt per request (an answer cache would serve repeats), `tokens` out, streamed."""
    messages = [{"role": "user", "content": f"{tag} request {i}: what does a control plane do?"}]
    body = {"model": model, "messages": messages, "max_tokens": tokens, "stream": True, "temperature": 0.7}
    return json.dumps(body).encode()


async def closed_loop(
    base_url: str,
    model: str,
    headers: dict[str, str],
    *,
    concurrency: int,
    requests: int,
    tokens: int,
    tag: str,
    timeout_s: float = 60.0,
) -> tuple[list[Sample], float]:
    """`requests` streamed chat completions by `concurrency` clients; the samples and the wall time (s)
    from the first send to the last answer."""
    url = urlsplit(base_url)
    path = url.path.rstrip("/") + "/chat/completions"
    counter = iter(range(requests))
    samples: list[Sample] = []

    async def client() -> None:
        conn = Connection(url.hostname or "127.0.0.1", url.port or 80)
        try:
            for i in counter:
                started, response = await conn.post(path, chat_body(model, tokens, tag, i), headers, timeout_s)
                ended = time.perf_counter()
                error = response.error
                if error is None and response.status != 200:
                    error = f"HTTP {response.status}"
                if error is None and response.tokens < tokens:
                    error = f"{response.tokens} of {tokens} tokens"
                first = response.first_token_s
                samples.append(
                    Sample(
                        (first - started) * 1000 if first is not None else None,
                        (ended - started) * 1000,
                        response.tokens,
                        error,
                    )
                )
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return samples, time.perf_counter() - started
