"""Stop strings in a streamed answer: cut before the first, and never a stop string's start sent early."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmbus_services.engine_worker.core.stops import HeldText


def test_a_stop_strings_start_is_held_until_the_next_piece_tells() -> None:
    answer = HeldText(("\nEND",))  # 4 characters: the last 3 of the text are held
    assert not answer.add("one two") and answer.release(False) == "one "
    assert not answer.add("\nE") and answer.release(False) == "tw"  # "o\nE" may begin "\nEND"
    assert answer.add("ND and more") and answer.release(True) == "o"
    assert answer.text == "one two"


@given(st.lists(st.text(alphabet="ab\n", max_size=4), max_size=12), st.text(alphabet="ab\n", min_size=1, max_size=3))
def test_what_is_sent_is_the_text_before_the_first_stop_however_it_is_cut(pieces: list[str], stop: str) -> None:
    answer, sent = HeldText((stop,)), ""
    for piece in pieces:
        stopped = answer.add(piece)
        sent += answer.release(stopped)
        assert stop not in sent
        if stopped:
            break
    else:
        sent += answer.release(True)
    full = "".join(pieces)
    assert sent == (full[: full.index(stop)] if stop in full else full)
