"""A zero-cost streaming OpenAI-compatible upstream, cheap enough not to be what a benchmark measures.

    python -m bench.peer_upstream --port 0     # prints "upstream on http://127.0.0.1:<port>/v1"

The peer benchmark puts the same upstream behind every gateway it compares, so the upstream's own
cost is in every row; it has to stay far below theirs. The tests' fixture
(llmbus_tools.harness.openai_server: starlette, a request object, a disconnect poll per token)
costs a few hundred microseconds of CPU per answer. This one is an asyncio protocol on uvloop with
httptools' parser (what uvicorn itself uses), no framework: it reads the body, and writes the whole
answer (every SSE event, the usage chunk, `[DONE]`) in one socket write, since generation costs
nothing. `bench/reports/peer.md` reports its CPU per request in every run.

Answers: `POST /v1/chat/completions` and `/v1/completions`, streaming or not, `max_tokens` (or
`max_completion_tokens`; at most `--answer-tokens`, so every client gets answers of one length
whatever it asks for) tokens " w0 w1 ...", finish_reason "length", usage when
`stream_options.include_usage` is set (always on a non-streaming answer); `GET /v1/models`.
HTTP/1.1 keep-alive, Content-Length bodies only (what every client here sends).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import time

import httptools
import uvloop

DEFAULT_TOKENS = 16
MAX_TOKENS = [1 << 30]  # --answer-tokens: the longest answer given, whatever max_tokens asks


def _tokens(body: dict[str, object]) -> int:
    asked = int(body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_TOKENS)  # type: ignore[call-overload]
    return min(asked, MAX_TOKENS[0])


def _sse(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def answer_events(body: dict[str, object], chat: bool, request_id: str) -> bytes:
    """Every SSE event of a streamed answer, `[DONE]` included, as one byte string."""
    tokens = _tokens(body)
    head = {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
    }
    head["model"] = body.get("model", "det")  # type: ignore[assignment]
    parts = []
    for i in range(tokens):
        choice = {"index": 0, "delta": {"content": f" w{i}"}} if chat else {"index": 0, "text": f" w{i}"}
        parts.append(_sse(head | {"choices": [choice | {"finish_reason": None}]}))
    last = {"index": 0, "delta": {}} if chat else {"index": 0, "text": ""}
    parts.append(_sse(head | {"choices": [last | {"finish_reason": "length"}]}))
    if ((body.get("stream_options") or {}) or {}).get("include_usage"):  # type: ignore[union-attr]
        parts.append(_sse(head | {"choices": [], "usage": _usage(body, tokens)}))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def answer_json(body: dict[str, object], chat: bool, request_id: str) -> bytes:
    tokens = _tokens(body)
    text = "".join(f" w{i}" for i in range(tokens))
    choice: dict[str, object] = (
        {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
    )
    answer = {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": body.get("model", "det"),
        "choices": [choice | {"finish_reason": "length"}],
        "usage": _usage(body, tokens),
    }
    return json.dumps(answer, separators=(",", ":")).encode()


def _usage(body: dict[str, object], completion_tokens: int) -> dict[str, object]:
    messages = body.get("messages") or [{"content": body.get("prompt", "")}]
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)  # type: ignore[union-attr]
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _response(status: str, content_type: str, payload: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(payload)}\r\n\r\n"
    return head.encode() + payload


MODELS = json.dumps({"object": "list", "data": [{"id": "det", "object": "model", "owned_by": "bench"}]}).encode()


class UpstreamProtocol(asyncio.Protocol):
    """One connection: httptools parses, each complete request is answered at once."""

    served = 0

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(_response("400 Bad Request", "text/plain", b"bad request"))
            self.transport.close()

    # httptools callbacks
    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        path = self.url.split(b"?", 1)[0]
        raw, self.url, self.body = b"".join(self.body), b"", []
        UpstreamProtocol.served += 1
        self.transport.write(self._answer(self.parser.get_method(), path, raw))
        if not self.parser.should_keep_alive():
            self.transport.close()

    def _answer(self, method: bytes, path: bytes, raw: bytes) -> bytes:
        if method == b"GET" and path.rstrip(b"/") == b"/v1/models":
            return _response("200 OK", "application/json", MODELS)
        chat = path == b"/v1/chat/completions"
        if method != b"POST" or not (chat or path == b"/v1/completions"):
            return _response("404 Not Found", "application/json", b'{"error":{"message":"not found"}}')
        try:
            body = json.loads(raw)
        except ValueError:
            return _response("400 Bad Request", "application/json", b'{"error":{"message":"body is not JSON"}}')
        request_id = f"cmpl-{UpstreamProtocol.served}"
        if not body.get("stream"):
            return _response("200 OK", "application/json", answer_json(body, chat, request_id))
        return _response("200 OK", "text/event-stream", answer_events(body, chat, request_id))


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, "127.0.0.1", port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    print(f"upstream on http://127.0.0.1:{bound}/v1", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    print(f"served {UpstreamProtocol.served} requests", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--answer-tokens", type=int, help="the longest answer, whatever max_tokens asks")
    args = parser.parse_args(argv)
    if args.answer_tokens:
        MAX_TOKENS[0] = args.answer_tokens
    uvloop.run(serve(args.port))


if __name__ == "__main__":
    main()
