"""The chunk contract on retries, applied to a client that cannot take text back.

Chunks carry their attempt; only the highest attempt seen counts, and a chunk of a new
attempt voids the text of the earlier ones. A Kafka client can drop that text; an HTTP
stream has already shown it. So the gateway shows each character once: a new attempt's
text is held back until it passes what was shown, and only the rest goes out. When the
new attempt says something else than what was already shown (sampling without a seed),
the stream cannot be repaired and ends with an error instead of showing mixed text.

This is the only place where the gateway dedupes chunks: swap it for the client
library's contract when that one lands.
"""

from __future__ import annotations

from llmbus.messages import TokenChunk


class RetryDiverged(RuntimeError):
    """A retried attempt's text does not continue what the client has already seen."""


class AttemptFilter:
    def __init__(self) -> None:
        self.attempt = 0
        self.text = ""  # the current attempt's text so far
        self.shown = ""  # what was handed to the client
        self._next_seq = 0
        self.final: TokenChunk | None = None

    def accept(self, chunk: TokenChunk) -> bool:
        """Take a chunk into the current attempt; False for a stale attempt's or a repeated one."""
        if chunk.attempt < self.attempt or self.final is not None:
            return False
        if chunk.attempt > self.attempt:
            self.attempt, self.text, self._next_seq = chunk.attempt, "", 0
        if chunk.seq < self._next_seq:
            return False
        self._next_seq = chunk.seq + 1
        self.text += chunk.delta
        if chunk.final:
            self.final = chunk
        return True

    def unseen(self) -> str:
        """The part of the current attempt's text not shown yet (marked shown now)."""
        if self.shown.startswith(self.text):  # a retry still catching up with what was shown
            return ""
        if not self.text.startswith(self.shown):
            raise RetryDiverged(
                f"attempt {self.attempt} produced different text than the {len(self.shown)} characters already sent"
            )
        delta, self.shown = self.text[len(self.shown) :], self.text
        return delta
