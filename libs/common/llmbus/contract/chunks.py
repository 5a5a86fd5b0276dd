"""The chunk contract a reader of a reply topic follows (client library, CLI, gateway).

A request's chunks arrive on its reply topic keyed by request id, so in the order they were
written. When a worker dies, is drained, or fails retryably, the scheduler places the request
again as attempt + 1. That attempt usually *continues* the answer (docs/delivery.md,
"Continuation across legs"): its chunks carry `continues` (the attempt it continues and its own
first seq) and go on numbering `seq` from there. Where it cannot, it streams again from `seq` 0. So:

- every chunk carries `attempt`; the reader shows the text of the highest attempt seen;
- a continuing attempt's text is the continued attempt's text up to its `continues.seq` (itself
  maybe a continuation), then its own chunks: a reader that showed exactly that goes on seamlessly;
- the first chunk of a higher attempt that does not continue what was shown voids all text received
  before it (the reader erases it, or shows that the answer restarts);
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

`ChunkAssembler` is that rule in one pure object: feed it chunks, show what it returns. A request with
`n` > 1 has its further choices on the same chunks (`TokenChunk.choices`); they follow the same rule
(such an answer is never continued). A reader that cannot erase (an HTTP stream that has already sent
the text) shows the assembler's text through `unshown` instead: each character once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from llmbus.contract.messages import ContinuedFrom, FinishReason, TokenChunk, TokenLogprob, ToolCallDelta


@dataclass
class ChoiceParts:
    """What one attempt sent of one choice so far: text pieces, tool call fragments, log-probabilities,
    and the reason it ended (a choice after the first: on the chunk that ended it)."""

    text: list[str] = field(default_factory=list)
    calls: list[ToolCallDelta] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    @property
    def joined(self) -> str:
        return "".join(self.text)


@dataclass(frozen=True)
class TextUpdate:
    """What to show for one accepted chunk: `restarted` means erase everything shown before `delta`."""

    chunk: TokenChunk
    delta: str
    restarted: bool = False

    @property
    def final(self) -> bool:
        return self.chunk.final


@dataclass(frozen=True)
class Segment:
    """A stretch of an answer: one attempt's chunks, in seq order, up to where a later attempt cut it."""

    attempt: int
    chunks: tuple[TokenChunk, ...]


@dataclass
class ChunkAssembler:
    attempt: int = 0  # the attempt whose text is shown: the highest seen, or the final's
    started: bool = False  # a chunk was shown (attempt 0 is a real attempt: the router's answers)
    restarts: int = 0  # how often a new attempt voided earlier text
    continuations: int = 0  # how often a new attempt continued the text shown, seamlessly
    final: TokenChunk | None = None
    _chunks: dict[int, list[TokenChunk]] = field(default_factory=dict)  # attempt → its content chunks, in order
    _continues: dict[int, ContinuedFrom] = field(default_factory=dict)  # attempt → the attempt it continues
    _calls: dict[int, list[ToolCallDelta]] = field(default_factory=dict)  # attempt → its tool call fragments
    _choices: dict[int, dict[int, ChoiceParts]] = field(default_factory=dict)  # attempt → the other choices (n > 1)
    _seen: set[tuple[int, int]] = field(default_factory=set)  # (attempt, seq) taken

    @property
    def text(self) -> str:
        """The current attempt's text so far, its continued prefix included (after the final chunk: the
        result's text)."""
        return self.text_of(self.attempt)

    def text_of(self, attempt: int) -> str:
        return "".join(c.delta for segment in self.segments(attempt) for c in segment.chunks)

    @property
    def tool_calls(self) -> list[ToolCallDelta]:
        """The current attempt's tool call fragments so far, in order (llmbus.contract.tool_calls assembles them)."""
        return self._calls.get(self.attempt, [])

    @property
    def logprobs(self) -> list[TokenLogprob]:
        """The log-probabilities of the current attempt's text's tokens so far (a request with logprobs)."""
        return [lp for segment in self.segments(self.attempt) for c in segment.chunks for lp in c.logprobs or ()]

    @property
    def choices(self) -> dict[int, ChoiceParts]:
        """The current attempt's choices after the first (a request with n > 1), by index."""
        return self._choices.get(self.attempt, {})

    @property
    def done(self) -> bool:
        return self.final is not None

    def segments(self, attempt: int) -> list[Segment]:
        """`attempt`'s answer as stretches of attempts, oldest first (`segments_of`)."""
        return segments_of(self._chunks, self._continues, attempt)

    def add(self, chunk: TokenChunk) -> TextUpdate | None:
        """Take one chunk; None when it must be ignored (stale attempt, duplicate, after the end)."""
        if self.final is not None or (chunk.attempt, chunk.seq) in self._seen:
            return None
        self._seen.add((chunk.attempt, chunk.seq))
        if chunk.continues is not None and chunk.continues.attempt < chunk.attempt:
            self._continues.setdefault(chunk.attempt, chunk.continues)
        if not chunk.final or chunk.delta or chunk.logprobs:  # content (a final chunk carries none)
            self._chunks.setdefault(chunk.attempt, []).append(chunk)
        if chunk.tool_calls:
            self._calls.setdefault(chunk.attempt, []).extend(chunk.tool_calls)
        for delta in chunk.choices or ():
            choice = self._choices.setdefault(chunk.attempt, {}).setdefault(delta.index, ChoiceParts())
            choice.text.append(delta.delta)
            choice.calls += delta.tool_calls or ()
            choice.logprobs += delta.logprobs or ()
            choice.finish_reason = delta.finish_reason or choice.finish_reason
        if chunk.attempt < self.attempt and not chunk.final:
            return None  # stale: kept aside in case its attempt turns out to hold the final marker
        if chunk.attempt == self.attempt or not self.started:
            self.attempt, self.started = chunk.attempt, True
            if chunk.final:
                self.final = chunk
            return TextUpdate(chunk, chunk.delta)
        shown, shown_attempt = self.text, self.attempt
        self.attempt = chunk.attempt
        if chunk.final:
            self.final = chunk
        text = self.text
        continuing = chunk.attempt > shown_attempt and chunk.attempt in self._continues
        if continuing and text.startswith(shown):
            self.continuations += 1
            return TextUpdate(chunk, text[len(shown) :])
        # A new attempt that starts again, or continues something else than what was shown; or a switch back
        # to an earlier attempt's text (its final): the whole text of the attempt now shown.
        restarted = bool(shown or self._seen_in(shown_attempt))
        self.restarts += restarted
        return TextUpdate(chunk, text if restarted else chunk.delta, restarted)

    def _seen_in(self, attempt: int) -> bool:
        return any(a == attempt for a, _ in self._seen)


def segments_of(
    chunks: dict[int, list[TokenChunk]], continues: dict[int, ContinuedFrom], attempt: int
) -> list[Segment]:
    """`attempt`'s answer as stretches of attempts, oldest first: the chain of attempts it continues (each cut
    where the next one continues it), then its own content chunks. `chunks`: each attempt's, in seq order."""
    chain: list[Segment] = []
    cut: int | None = None  # where the later attempt cut this one
    seen: set[int] = set()
    while attempt not in seen:  # a marker pointing back into the chain would be a loop: stop there
        seen.add(attempt)
        own = chunks.get(attempt, [])
        chain.append(Segment(attempt, tuple(c for c in own if cut is None or c.seq < cut)))
        marker = continues.get(attempt)
        if marker is None:
            break
        attempt, cut = marker.attempt, marker.seq
    return chain[::-1]


def gaps(segments: list[Segment], first_seq: int = 0) -> Iterator[str]:
    """What keeps `segments` from being a whole answer: each must go on, seq by seq, from where the one
    before it was cut (the first from `first_seq`). Nothing: every chunk of it is there."""
    expected = first_seq
    for segment in segments:
        for chunk in segment.chunks:
            if chunk.seq != expected:
                yield f"attempt {segment.attempt}: seq {chunk.seq} where {expected} was due"
                return
            expected += 1


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


@dataclass
class ShownChoice:
    """What a reader that cannot erase has sent of one further choice (n > 1); `take` gives the rest."""

    text: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)
    logprobs: int = 0
    finished: bool = False

    def take(
        self, parts: ChoiceParts
    ) -> tuple[str, list[ToolCallDelta], list[TokenLogprob], FinishReason | None] | None:
        """(text, tool call fragments, log-probabilities, finish reason) not sent yet, marked sent; None when
        nothing is new. RetryDiverged as for the first choice's text."""
        delta, calls = unshown(parts.joined, self.text), unshown_tool_calls(parts.calls, self.calls)
        logprobs = parts.logprobs[self.logprobs :]
        ended = parts.finish_reason if not self.finished else None
        if not (delta or calls or logprobs or ended):
            return None
        self.text += delta
        self.calls += calls
        self.logprobs += len(logprobs)
        self.finished = self.finished or ended is not None
        return delta, calls, logprobs, ended


@dataclass(frozen=True)
class SoFar:
    """What a reader of the reply topic was sent of an answer, as the next leg must continue it: the
    `segments` of the highest attempt that streamed text (its continued prefix first). `problem`: why it
    cannot be continued (then the next attempt starts the answer again). `final`: the final chunk that already
    ended the stream (its worker died before its result was written): that answer is the client's, whole."""

    attempt: int
    segments: list[Segment]
    problem: str | None = None
    final: TokenChunk | None = None

    @property
    def chunks(self) -> list[TokenChunk]:
        return [chunk for segment in self.segments for chunk in segment.chunks]

    @property
    def text(self) -> str:
        return "".join(chunk.delta for chunk in self.chunks)

    @property
    def next_seq(self) -> int:
        chunks = self.chunks
        return chunks[-1].seq + 1 if chunks else 0


def answer_so_far(chunks: Iterable[TokenChunk], before_attempt: int) -> SoFar | None:
    """The answer a client was sent by the attempts before `before_attempt`, from the request's chunks in
    the order they were written (one tenant's request). None: no attempt streamed any of it. A final chunk
    that already ended the stream comes with the answer it ended (`SoFar.final`)."""
    assembler = ChunkAssembler()
    for chunk in chunks:
        if chunk.attempt < before_attempt:
            assembler.add(chunk)
    if (final := assembler.final) is not None:
        return SoFar(final.attempt, assembler.segments(final.attempt), final=final)
    attempt = max((a for a, sent in assembler._chunks.items() if sent), default=None)
    if attempt is None:
        return None
    segments = assembler.segments(attempt)
    problem = next(gaps(segments), None)
    if problem is None and assembler._calls.get(attempt):
        problem = "the answer so far has tool calls"
    if problem is None and assembler._choices.get(attempt):
        problem = "the answer has several choices"
    return SoFar(attempt, segments, problem)
