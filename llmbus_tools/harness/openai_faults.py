"""Faults a fake OpenAI upstream (openai_server.py) injects, one kind at a time, as hosted providers fail.

`Fault(kind, ...)` applies to the next `times` completion requests (None: every one until cleared):

| kind | what the upstream does |
|---|---|
| `status` | answers `status` (429, 500, 503, ...) with OpenAI's error body and `retry_after` as its Retry-After |
| `reset` | resets the connection (TCP RST) before answering anything |
| `stall_first_byte` | sends nothing at all, holding the connection, until the client gives up |
| `stall_mid` | streams `after_tokens` tokens, then nothing more, holding the connection |
| `cut_mid` | streams `after_tokens` tokens, then closes the connection (no finish_reason, no [DONE]) |
| `malformed_mid` | streams `after_tokens` tokens, then an event that is not JSON, then goes on |
| `empty_200` | answers 200 with an empty event stream |
| `context_length_exceeded` | answers 400 as OpenAI does for a prompt over the model's window (`window` tokens) |
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass
from typing import Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

FaultKind = Literal[
    "status",
    "reset",
    "stall_first_byte",
    "stall_mid",
    "cut_mid",
    "malformed_mid",
    "empty_200",
    "context_length_exceeded",
]
MID_ANSWER = ("stall_mid", "cut_mid", "malformed_mid")


@dataclass
class Fault:
    kind: FaultKind
    status: int = 500
    retry_after: str | None = None
    after_tokens: int = 8
    times: int | None = None  # None: every request until cleared
    window: int = 8192  # context_length_exceeded: the window the error names

    def take(self) -> bool:
        """Whether this request gets the fault (and one fewer remains)."""
        if self.times is None:
            return True
        if self.times <= 0:
            return False
        self.times -= 1
        return True


def refusal(fault: Fault, prompt_tokens: int) -> Response | None:
    """The answer a fault gives instead of a stream (None: the fault acts on the stream or the socket)."""
    if fault.kind == "status":
        headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
        kind = "rate_limit_error" if fault.status == 429 else "server_error"
        body = {"error": {"message": f"injected {fault.status}", "type": kind, "param": None, "code": None}}
        return JSONResponse(body, status_code=fault.status, headers=headers)
    if fault.kind == "context_length_exceeded":
        message = (
            f"This model's maximum context length is {fault.window} tokens. However, your messages resulted in "
            f"{max(prompt_tokens, fault.window + 1)} tokens. Please reduce the length of the messages."
        )
        error = {"message": message, "type": "invalid_request_error", "param": "messages"}
        return JSONResponse({"error": error | {"code": "context_length_exceeded"}}, status_code=400)
    if fault.kind == "empty_200":
        return Response(b"", media_type="text/event-stream")
    return None


def reset(request: Request) -> None:
    """Reset the request's TCP connection now (SO_LINGER 0, then close): the client reads ECONNRESET."""
    cycle = request.scope["llmbus.raw_send"].__self__  # uvicorn's RequestResponseCycle
    transport = cycle.transport
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def hold(request: Request, limit_s: float = 600.0) -> None:
    """Send nothing until the client goes away (or `limit_s`)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + limit_s
    while loop.time() < until and not await request.is_disconnected():
        await asyncio.sleep(0.05)


def malformed_event() -> str:
    return "data: {not json\n\n"


def continuation_start(body: dict[str, object]) -> tuple[int, bool]:
    """Where a continued answer starts (tokens already written: the partial answer's words) and whether the
    request asks to continue: vLLM's `continue_final_message`, or `prefix` on the last assistant message."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or messages[-1].get("role") != "assistant":
        return 0, False
    last = messages[-1]
    if not (body.get("continue_final_message") or last.get("prefix")):
        return 0, False
    return len(str(last.get("content") or "").split()), True
