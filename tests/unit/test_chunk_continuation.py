"""Continuing attempts in the chunk contract (llmbus.contract.chunks): one seamless answer for a reader,
and `answer_so_far`, what the next leg continues from, rebuilt from the reply topic's chunks."""

from __future__ import annotations

from llmbus.contract.chunks import ChunkAssembler, answer_so_far, unshown
from llmbus.contract.messages import ContinuedFrom, FunctionCallDelta, TokenChunk, ToolCallDelta


def chunk(seq: int, delta: str = "", attempt: int = 1, final: bool = False, **fields: object) -> TokenChunk:
    return TokenChunk(request_id="r1", tenant="t", seq=seq, delta=delta, attempt=attempt, final=final, **fields)  # type: ignore[arg-type]


def cont(seq: int, delta: str, attempt: int, continues: tuple[int, int], final: bool = False) -> TokenChunk:
    marker = ContinuedFrom(attempt=continues[0], seq=continues[1])
    return chunk(seq, delta, attempt, final, continues=marker)


# Attempt 1 streams " a b c" and dies; attempt 2 continues it from seq 3 (" d e") and dies; attempt 3
# continues attempt 2 from seq 5 and ends the answer.
TWICE_CONTINUED = [
    chunk(0, " a"),
    chunk(1, " b"),
    chunk(2, " c"),
    cont(3, " d", 2, (1, 3)),
    cont(4, " e", 2, (1, 3)),
    cont(5, " f", 3, (2, 5)),
    cont(6, "", 3, (2, 5), final=True),
]


def test_a_continued_answer_reads_as_one_stream() -> None:
    assembler = ChunkAssembler()
    updates = [assembler.add(c) for c in TWICE_CONTINUED]
    assert all(u is not None and not u.restarted for u in updates)
    assert "".join(u.delta for u in updates if u is not None) == " a b c d e f"
    assert assembler.text == " a b c d e f" and assembler.restarts == 0 and assembler.continuations == 2
    assert [s.attempt for s in assembler.segments(3)] == [1, 2, 3]


def test_a_reader_that_cannot_erase_goes_on_through_a_continuation() -> None:
    assembler, shown = ChunkAssembler(), ""
    for c in TWICE_CONTINUED:
        assembler.add(c)
        shown += unshown(assembler.text, shown)
    assert shown == " a b c d e f"


def test_zombie_chunks_past_the_cut_are_not_part_of_the_continued_answer() -> None:
    """Attempt 1 (a zombie) writes seq 3 after attempt 2 was told it ends at seq 3: a reader that showed it
    restarts with the continued answer; one that had not takes attempt 2 as it is."""
    shown_zombie = ChunkAssembler()
    for c in [chunk(0, " a"), chunk(1, " b"), chunk(2, " c"), chunk(3, " zombie")]:
        shown_zombie.add(c)
    update = shown_zombie.add(cont(3, " d", 2, (1, 3)))
    assert update is not None and update.restarted and update.delta == " a b c d"
    late = ChunkAssembler()
    for c in [chunk(0, " a"), chunk(1, " b"), chunk(2, " c"), cont(3, " d", 2, (1, 3))]:
        assert (u := late.add(c)) is not None and not u.restarted
    assert late.add(chunk(3, " zombie")) is None and late.text == " a b c d"


def test_the_next_leg_continues_exactly_what_was_sent() -> None:
    so_far = answer_so_far(TWICE_CONTINUED[:5], before_attempt=3)
    assert so_far is not None and so_far.problem is None
    assert so_far.attempt == 2 and so_far.text == " a b c d e" and so_far.next_seq == 5
    assert [(s.attempt, [c.seq for c in s.chunks]) for s in so_far.segments] == [(1, [0, 1, 2]), (2, [3, 4])]


def test_nothing_to_continue_when_nothing_was_streamed_or_the_answer_ended() -> None:
    assert answer_so_far([], before_attempt=2) is None
    ended = answer_so_far(TWICE_CONTINUED, before_attempt=4)  # its final chunk is out: that answer is whole
    assert ended is not None and ended.final is not None and ended.final.attempt == 3
    assert ended.text == " a b c d e f" and ended.attempt == 3


def test_an_attempt_that_streamed_nothing_is_skipped() -> None:
    """Attempt 2 failed before its first chunk: attempt 3 continues attempt 1."""
    so_far = answer_so_far(TWICE_CONTINUED[:3], before_attempt=3)
    assert so_far is not None and so_far.attempt == 1 and so_far.next_seq == 3


def test_a_gap_or_tool_calls_make_an_answer_that_cannot_be_continued() -> None:
    gap = answer_so_far([chunk(0, " a"), chunk(2, " c")], before_attempt=2)
    assert gap is not None and gap.problem is not None and "seq 2 where 1 was due" in gap.problem
    call = ToolCallDelta(index=0, id="c1", type="function", function=FunctionCallDelta(name="f"))
    calls = answer_so_far([chunk(0, "", tool_calls=[call])], before_attempt=2)
    assert calls is not None and calls.problem == "the answer so far has tool calls"


def test_a_restarted_attempt_is_continued_from_its_own_start() -> None:
    """Attempt 2 restarted the answer (no marker); attempt 3 continues attempt 2 alone."""
    chunks = [chunk(0, " old"), chunk(0, " new", attempt=2), chunk(1, " text", attempt=2)]
    so_far = answer_so_far(chunks, before_attempt=3)
    assert so_far is not None and so_far.text == " new text" and so_far.next_seq == 2
