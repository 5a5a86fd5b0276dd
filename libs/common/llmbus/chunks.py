"""The chunk contract a reader of a reply topic follows (client library, CLI, gateway).

A request's chunks arrive on its reply topic keyed by request id, so in the order they were
written. When a worker dies, is drained, or fails retryably, the scheduler places the
request again as attempt + 1 and the new attempt streams from `seq` 0. So:

- every chunk carries `attempt`; the reader keeps only the text of the highest attempt seen;
- the first chunk of a higher attempt voids all text received before it (the reader erases
  it, or shows that the answer restarts);
- chunks of a lower attempt than the highest seen are stale (a zombie's, or late) and dropped,
  and so is a chunk whose (attempt, seq) was already taken;
- the final chunk (`final: true`) ends the stream, whatever its attempt: only one attempt
  can publish it (the final marker is claimed with SET NX carrying the attempt), and the text
  of its attempt equals the InferenceResult's text. A final error (deadline, max attempts)
  comes from the scheduler with the latest attempt and carries no text. The router's own
  answers (cache hit, refusal) carry attempt 0, the attempt they claimed the marker with;
- a chunk may arrive twice (a send retried through a broker restart): same (attempt, seq),
  same content; the copy is dropped.

`ChunkAssembler` is that rule in one pure object: feed it chunks, show what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmbus.messages import TokenChunk


@dataclass(frozen=True)
class TextUpdate:
    """What to show for one accepted chunk: `restarted` means erase everything shown before `delta`."""

    chunk: TokenChunk
    delta: str
    restarted: bool = False

    @property
    def final(self) -> bool:
        return self.chunk.final


@dataclass
class ChunkAssembler:
    attempt: int = 0  # highest attempt seen; 0 before the first chunk
    restarts: int = 0  # how often a new attempt voided earlier text
    final: TokenChunk | None = None
    _parts: list[str] = field(default_factory=list)
    _seen_seq: set[int] = field(default_factory=set)  # seqs taken in the current attempt

    @property
    def text(self) -> str:
        """The current attempt's text so far (after the final chunk: the result's text)."""
        return "".join(self._parts)

    @property
    def done(self) -> bool:
        return self.final is not None

    def add(self, chunk: TokenChunk) -> TextUpdate | None:
        """Take one chunk; None when it must be ignored (stale attempt, duplicate, after the end)."""
        if self.final is not None:
            return None
        restarted = False
        if chunk.attempt > self.attempt:
            restarted = self.attempt > 0 and bool(self._parts or self._seen_seq)
            self.restarts += restarted
            self.attempt = chunk.attempt
            self._parts, self._seen_seq = [], set()
        elif chunk.attempt < self.attempt and not chunk.final:
            return None
        if chunk.seq in self._seen_seq and chunk.attempt == self.attempt:
            return None
        self._seen_seq.add(chunk.seq)
        if chunk.final:
            self.final = chunk
        if chunk.delta:
            self._parts.append(chunk.delta)
        return TextUpdate(chunk, chunk.delta, restarted)
