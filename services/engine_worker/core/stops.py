"""Stop strings (pure): where the earliest one starts, for engines that look for them in their own text."""

from __future__ import annotations


def first_stop(text: str, stops: tuple[str, ...], new_from: int) -> int | None:
    """Index where the earliest stop string starts, if one ends in the new part of `text` (from `new_from`).

    Like vLLM, the answer then ends before the stop string, which is not returned."""
    positions = []
    for stop in stops:
        if not stop:
            continue
        at = text.find(stop, max(0, new_from - len(stop) + 1))
        if at != -1:
            positions.append(at)
    return min(positions) if positions else None


class HeldText:
    """An answer's text as it streams, cut before the first stop string. What may be the start of a stop string
    is held back until the next pieces tell (vLLM's stop buffer), so a client never sees a stop string's first
    characters that the answer then loses."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.hold = max((len(stop) for stop in stops if stop), default=1) - 1
        self.text = ""
        self.sent = 0

    def add(self, piece: str) -> bool:
        """Append `piece`; True when a stop string now ends the answer (the text is cut before it)."""
        before = len(self.text)
        self.text += piece
        stop_at = first_stop(self.text, self.stops, before)
        if stop_at is None:
            return False
        self.text = self.text[:stop_at]
        return True

    def release(self, final: bool) -> str:
        """What may go to the client now: everything at the end, else all but the held tail."""
        upto = len(self.text) if final else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent : upto], upto
        return out
