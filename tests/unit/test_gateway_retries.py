"""A retried request through the gateway's own stream code: the chunk contract of llmbus.contract.chunks
(ChunkAssembler + unshown) sends each character to the HTTP client once, in order."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from llmbus.contract.messages import ContinuedFrom, ErrorCode, ErrorInfo, FinishReason, InferenceRequest, TokenChunk
from llmbus_services.gateway.adapters.relay import Exchange
from llmbus_services.gateway.core.translate import ResponseShape
from llmbus_services.gateway.flows.completions import _sse_events


def chunk(seq: int, delta: str = "", attempt: int = 1, final: bool = False, **fields: object) -> TokenChunk:
    return TokenChunk(request_id="r1", tenant="t", seq=seq, delta=delta, attempt=attempt, final=final, **fields)  # type: ignore[arg-type]


class FakeRelay:
    """What an Exchange asks of its relay when it closes."""

    def __init__(self) -> None:
        self.forgotten = 0
        self.cancelled: list[str] = []

    def forget(self, exchange: Exchange) -> None:
        self.forgotten += 1

    def cancel_later(self, request: InferenceRequest, reason: str) -> None:
        self.cancelled.append(request.request_id)


def exchange_of(chunks: list[TokenChunk]) -> tuple[Exchange, FakeRelay]:
    relay = FakeRelay()
    queue: asyncio.Queue[TokenChunk] = asyncio.Queue()
    for c in chunks:
        queue.put_nowait(c)
    request = InferenceRequest(request_id="r1", tenant="t", model="m", prompt="p")
    return Exchange(relay, request, queue), relay  # type: ignore[arg-type]  # the relay's closing part only


async def sse_events(chunks: list[TokenChunk]) -> tuple[list[dict[str, object]], FakeRelay]:
    """What a streaming client receives, as `complete` drives it: the events, [DONE] left out."""
    exchange, relay = exchange_of(chunks)
    gw = SimpleNamespace(settings=SimpleNamespace(chunk_gap_timeout_s=1.0))
    await exchange.next_chunk(1.0)  # `complete` waits for the first chunk before it answers 200
    raw = [
        part
        async for part in _sse_events(
            gw,  # type: ignore[arg-type]  # the settings part only
            exchange,
            ResponseShape("chat", "r1", 0, "m"),
            include_usage=False,
            started=0.0,
        )
    ]
    events = [json.loads(part.removeprefix(b"data: ")) for part in raw if part != b"data: [DONE]\n\n"]
    return events, relay


def text_of(events: list[dict[str, object]]) -> str:
    return "".join(e["choices"][0]["delta"].get("content", "") for e in events if e.get("choices"))  # type: ignore[index]


# Attempt 1 streams "The quick ", its worker is lost; attempt 2 starts over and goes further;
# a zombie chunk of attempt 1 and a repeat of attempt 2 arrive late.
RETRIED = [
    chunk(0, "The "),
    chunk(1, "quick "),
    chunk(0, "The ", attempt=2),
    chunk(2, "slow", attempt=1),  # stale: attempt 1 was abandoned
    chunk(1, "quick brown", attempt=2),
    chunk(1, "quick brown", attempt=2),  # repeated
    chunk(2, " fox", attempt=2),
    chunk(3, attempt=2, final=True, finish_reason=FinishReason.STOP),
]


async def test_a_retried_stream_sends_every_character_once() -> None:
    events, relay = await sse_events(RETRIED)
    assert text_of(events) == "The quick brown fox"
    deltas = [e["choices"][0]["delta"].get("content") for e in events]  # type: ignore[index]
    assert deltas == ["The ", "quick ", "brown", " fox", ""]  # attempt 2 held back until it passed "The quick "
    assert events[-1]["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
    assert relay.forgotten == 1 and relay.cancelled == []  # finished: nothing to cancel


async def test_the_exchange_keeps_the_last_attempts_text_for_a_full_answer() -> None:
    exchange, _ = exchange_of(RETRIED)
    while not exchange.finished:
        await exchange.next_chunk(1.0)
    assert exchange.assembler.text == "The quick brown fox" and exchange.assembler.attempt == 2
    assert exchange.assembler.restarts == 1
    with pytest.raises(TimeoutError):  # the zombie and the repeat were skipped, the final ended it
        await exchange.next_chunk(0.05)


async def test_a_retry_that_says_something_else_ends_the_stream_with_an_error() -> None:
    events, relay = await sse_events([chunk(0, "Yes, "), chunk(0, "No", attempt=2), chunk(1, " way", attempt=2)])
    assert text_of(events) == "Yes, "  # never "Yes, No way"
    assert events[-1]["error"]["code"] == "service_unavailable"  # type: ignore[index]
    assert relay.cancelled == ["r1"]  # the request is left unfinished: cancelled through llm.control


async def test_a_final_error_after_text_ends_the_stream_with_that_error() -> None:
    error = ErrorInfo.of(ErrorCode.MAX_ATTEMPTS, "3 attempts failed")
    events, _ = await sse_events([chunk(0, "partial"), chunk(0, attempt=3, final=True, error=error)])
    assert text_of(events) == "partial"
    assert events[-1]["error"]["code"] == "max_attempts"  # type: ignore[index]


async def test_a_continued_answer_with_sampling_reaches_the_http_client_as_one_stream() -> None:
    """Attempt 2 continues attempt 1's answer (a sampled one: a restart could never match it): no error
    event, every character once, the continuation's text right after what was sent."""
    marker = ContinuedFrom(attempt=1, seq=2)
    stream = [
        chunk(0, "The "),
        chunk(1, "quick "),
        chunk(2, "brown", attempt=2, continues=marker),
        chunk(2, "red", attempt=1),  # a zombie's, past the cut: stale once attempt 2 is shown
        chunk(3, " fox", attempt=2, continues=marker),
        chunk(4, attempt=2, final=True, finish_reason=FinishReason.STOP, continues=marker),
    ]
    events, relay = await sse_events(stream)
    assert text_of(events) == "The quick brown fox"
    assert [e["choices"][0]["delta"].get("content") for e in events] == ["The ", "quick ", "brown", " fox", ""]  # type: ignore[index]
    assert all("error" not in e for e in events) and relay.cancelled == []
