"""The chunk contract on retries (llmbus.contract.chunks): the highest attempt wins, stale and repeated chunks drop."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import pytest
from rich.console import Console

from llmbus.cli.chat_view import show_stream
from llmbus.contract.chunks import ChunkAssembler, RetryDiverged, TextUpdate, unshown
from llmbus.contract.messages import ErrorCode, ErrorInfo, FunctionCallDelta, TokenChunk, ToolCallDelta


def chunk(seq: int, delta: str = "", attempt: int = 1, final: bool = False, **fields: object) -> TokenChunk:
    return TokenChunk(request_id="r1", tenant="t", seq=seq, delta=delta, attempt=attempt, final=final, **fields)  # type: ignore[arg-type]


# Attempt 1 streams "Hello wor", its worker dies; attempt 2 streams the whole answer; a zombie
# chunk of attempt 1 and a repeated chunk of attempt 2 arrive late.
RETRIED = [
    chunk(0, "Hello "),
    chunk(1, "wor"),
    chunk(0, "Hello ", attempt=2),
    chunk(2, "ld?!", attempt=1),  # stale: attempt 1 was abandoned
    chunk(1, "world", attempt=2),
    chunk(1, "world", attempt=2),  # repeated
    chunk(2, final=True, attempt=2),
]


def test_a_new_attempt_voids_earlier_text_and_stale_chunks_are_dropped() -> None:
    assembler = ChunkAssembler()
    updates = [assembler.add(c) for c in RETRIED]
    assert [u is not None for u in updates] == [True, True, True, False, True, False, True]
    assert [u.restarted for u in updates if u is not None] == [False, False, True, False, False]
    assert assembler.text == "Hello world" and assembler.attempt == 2 and assembler.restarts == 1
    assert assembler.done and assembler.add(chunk(3, "late", attempt=3)) is None  # nothing after the end


def test_a_final_from_an_earlier_attempt_brings_its_text_back() -> None:
    """Attempt 1 won the final marker in its lease window while attempt 2 had begun streaming:
    the answer is attempt 1's (the result's text), so the reader switches back to it."""
    assembler = ChunkAssembler()
    assembler.add(chunk(0, "Hello "))
    assembler.add(chunk(0, "Hi", attempt=2))
    assert assembler.add(chunk(1, "world")) is None  # stale while attempt 2 is shown, but kept aside
    update = assembler.add(chunk(2, final=True, attempt=1))
    assert update is not None and update.restarted and update.final and update.delta == "Hello world"
    assert assembler.text == "Hello world" and assembler.attempt == 1 and assembler.restarts == 2
    assert unshown(assembler.text, "") == "Hello world"


def test_the_routers_attempt_0_answer_after_a_workers_attempt_1_chunks_wins() -> None:
    """A redelivered request: a worker's attempt-1 chunks reach the reply topic, then the router's
    cache-hit answer (attempt 0), which holds the final marker. Its text is the answer, not a mix."""
    assembler = ChunkAssembler()
    assembler.add(chunk(0, "generated ", attempt=1))
    assert assembler.add(chunk(0, "cached answer", attempt=0)) is None  # kept aside
    update = assembler.add(chunk(1, final=True, attempt=0))
    assert update is not None and update.restarted and update.delta == "cached answer"
    assert assembler.text == "cached answer" and assembler.attempt == 0
    # the other order: the router's text shown first, then a worker's attempt 1 restarts the text
    # (never appended to it), and the router's final brings its answer back
    other = ChunkAssembler()
    other.add(chunk(0, "cached answer", attempt=0))
    update = other.add(chunk(0, "generated ", attempt=1))
    assert update is not None and update.restarted and other.text == "generated "
    update = other.add(chunk(1, final=True, attempt=0))
    assert update is not None and update.restarted and other.text == "cached answer"
    # the router's answer alone: attempt 0 from the start, no restart
    alone = ChunkAssembler()
    updates = [alone.add(chunk(0, "cached answer", attempt=0)), alone.add(chunk(1, final=True, attempt=0))]
    assert [u.restarted for u in updates if u is not None] == [False, False] and alone.text == "cached answer"


def test_a_final_error_of_the_scheduler_ends_the_stream() -> None:
    assembler = ChunkAssembler()
    assembler.add(chunk(0, "partial"))
    error = ErrorInfo.of(ErrorCode.MAX_ATTEMPTS, "3 attempts failed")
    update = assembler.add(chunk(0, final=True, attempt=3, error=error))
    assert update is not None and update.restarted and update.final
    assert assembler.text == "" and assembler.final is not None and assembler.final.error == error


async def _updates(chunks: list[TokenChunk]) -> AsyncIterator[TextUpdate]:
    assembler = ChunkAssembler()
    for c in chunks:
        if (update := assembler.add(c)) is not None:
            yield update


async def test_the_cli_says_the_answer_restarts_and_returns_only_the_last_attempt() -> None:
    out = io.StringIO()
    shown_answer = await show_stream(_updates(RETRIED), Console(file=out, width=200, color_system=None))
    assert shown_answer.text == "Hello world" and shown_answer.error is None
    shown = out.getvalue()
    assert "attempt 2: the answer restarts" in shown
    assert "ld?!" not in shown and shown.count("world") == 1


def test_a_reader_that_cannot_erase_sees_each_character_once() -> None:
    assembler = ChunkAssembler()
    shown = ""
    for c in RETRIED:
        assembler.add(c)
        shown += unshown(assembler.text, shown)
        assert assembler.text.startswith(shown) or shown.startswith(assembler.text)
    assert shown == "Hello world"
    assert unshown("Hel", "Hello ") == ""  # a retry still catching up: held back
    assert unshown("Hello world", "Hello ") == "world"  # past it: only the rest


def test_a_retry_that_says_something_else_cannot_be_shown_to_a_reader_that_cannot_erase() -> None:
    with pytest.raises(RetryDiverged):
        unshown("No", "Yes")


async def test_the_cli_shows_the_tool_calls_of_the_answer() -> None:
    def call(index: int, **fields: object) -> ToolCallDelta:
        return ToolCallDelta(index=index, **fields)  # type: ignore[arg-type]

    chunks = [
        chunk(0, tool_calls=[call(0, id="call_1", type="function", function=FunctionCallDelta(name="lookup"))]),
        chunk(1, tool_calls=[call(0, function=FunctionCallDelta(arguments='{"partition": '))]),
        chunk(2, tool_calls=[call(0, function=FunctionCallDelta(arguments="3}"))]),
        chunk(3, final=True, finish_reason="tool_calls"),
    ]
    out = io.StringIO()
    shown = await show_stream(_updates(chunks), Console(file=out, width=200, color_system=None))
    assert [(c.id, c.function.name, c.function.arguments) for c in shown.tool_calls] == [
        ("call_1", "lookup", '{"partition": 3}')
    ]
    assert 'tool call call_1: lookup({"partition": 3})' in out.getvalue()


def test_a_fallback_that_numbered_its_attempts_from_1_again_would_splice_two_answers() -> None:
    """Why a fallback's attempts number past every earlier one. The first model's attempt 1 streamed
    " w0 w1 w2" in two chunks and broke off; the next model answers " w0 w1 w2 w3 w4", batched otherwise.
    Numbered attempt 1 again, its (attempt, seq) pairs look like copies of what the reader has: the reader
    keeps the first model's seq 0 and 1 and the next one's seq 2 on: " w3" is missing, and nothing says so.
    Numbered past them (attempt 2), the reader starts afresh: the whole answer."""
    first_model = [chunk(0, " w0"), chunk(1, " w1 w2")]
    next_model = [" w0 w1 w2", " w3", " w4"]
    reused = ChunkAssembler()
    for c in [*first_model, *(chunk(seq, text) for seq, text in enumerate(next_model)), chunk(3, final=True)]:
        reused.add(c)
    assert reused.text == " w0 w1 w2 w4"  # " w3" lost: the silent truncation
    numbered = ChunkAssembler()
    later = [chunk(seq, text, attempt=2) for seq, text in enumerate(next_model)]
    for c in [*first_model, *later, chunk(3, final=True, attempt=2)]:
        numbered.add(c)
    assert numbered.text == " w0 w1 w2 w3 w4" and numbered.restarts == 1
