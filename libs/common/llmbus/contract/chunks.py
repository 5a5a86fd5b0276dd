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
  answers (cache hit, refusal) carry attempt 0, the attempt they claimed the marker with.
  When the final comes from an attempt lower than the highest seen (the earlier attempt won
  the marker in its lease window while the next one had started streaming; or the router's
  attempt-0 answer after a worker's attempt-1 chunks), the answer is that earlier attempt's
  text: the reader switches back to it (a restart), so the assembler keeps the text of stale
  attempts aside instead of dropping it;
- a chunk may arrive twice (a send retried through a broker restart): same (attempt, seq),
  same content; the copy is dropped.

`ChunkAssembler` is that rule in one pure object: feed it chunks, show what it returns.
A reader that cannot erase (an HTTP stream that has already sent the text) shows the
assembler's text through `unshown` instead: each character once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmbus.contract.messages import TokenChunk, ToolCallDelta


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
    attempt: int = 0  # the attempt whose text is shown: the highest seen, or the final's
    started: bool = False  # a chunk was shown (attempt 0 is a real attempt: the router's answers)
    restarts: int = 0  # how often a new attempt voided earlier text
    final: TokenChunk | None = None
    _parts: dict[int, list[str]] = field(default_factory=dict)  # attempt → its text so far
    _calls: dict[int, list[ToolCallDelta]] = field(default_factory=dict)  # attempt → its tool call fragments
    _seen: set[tuple[int, int]] = field(default_factory=set)  # (attempt, seq) taken

    @property
    def text(self) -> str:
        """The current attempt's text so far (after the final chunk: the result's text)."""
        return "".join(self._parts.get(self.attempt, ()))

    @property
    def tool_calls(self) -> list[ToolCallDelta]:
        """The current attempt's tool call fragments so far, in order (llmbus.contract.tool_calls assembles them)."""
        return self._calls.get(self.attempt, [])

    @property
    def done(self) -> bool:
        return self.final is not None

    def add(self, chunk: TokenChunk) -> TextUpdate | None:
        """Take one chunk; None when it must be ignored (stale attempt, duplicate, after the end)."""
        if self.final is not None or (chunk.attempt, chunk.seq) in self._seen:
            return None
        self._seen.add((chunk.attempt, chunk.seq))
        parts = self._parts.setdefault(chunk.attempt, [])
        if chunk.delta:
            parts.append(chunk.delta)
        if chunk.tool_calls:
            self._calls.setdefault(chunk.attempt, []).extend(chunk.tool_calls)
        if chunk.attempt < self.attempt and not chunk.final:
            return None  # stale: kept aside in case its attempt turns out to hold the final marker
        switching = chunk.attempt != self.attempt and self.started
        restarted = switching and bool(self.text or self._seen_in(self.attempt))
        self.restarts += restarted
        self.attempt, self.started = chunk.attempt, True
        if chunk.final:
            self.final = chunk
        # After a restart the whole text of the attempt now shown (a switch back to an earlier
        # attempt brings its text along); otherwise just this chunk's.
        return TextUpdate(chunk, self.text if restarted else chunk.delta, restarted)

    def _seen_in(self, attempt: int) -> bool:
        return any(a == attempt for a, _ in self._seen)


class RetryDiverged(RuntimeError):
    """A retried attempt's text does not continue what a reader that cannot erase has already shown."""


def unshown(text: str, shown: str) -> str:
    """The part of the current attempt's `text` that a reader which cannot erase has not shown yet.

    After a restart the new attempt's text is held back (empty) until it passes `shown`, and only
    the rest goes out. When the new attempt says something else than what was shown (sampling
    without a seed), the stream cannot be repaired: RetryDiverged rather than mixed text.
    """
    if shown.startswith(text):  # a retry still catching up with what was shown (or nothing new)
        return ""
    if not text.startswith(shown):
        raise RetryDiverged(f"the new attempt's text differs from the {len(shown)} characters already shown")
    return text[len(shown) :]


def unshown_tool_calls(calls: list[ToolCallDelta], shown: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """`unshown` for tool call fragments: the current attempt's ones not sent yet; RetryDiverged when
    a retry's calls differ from those already sent."""
    if len(calls) <= len(shown):
        if calls == shown[: len(calls)]:
            return []
    elif calls[: len(shown)] == shown:
        return calls[len(shown) :]
    raise RetryDiverged(f"the new attempt's tool calls differ from the {len(shown)} fragments already shown")
