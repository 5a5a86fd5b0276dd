"""What each client saw of its answer, checked after a fault scenario that cuts answers mid-stream.

The delivery audit (`llmbus.audit.check`) asks whether the answering attempt's chunks, with the attempts it
continues, are a clean stream of the result's text. This effect asks what a client that follows the chunk
contract (`llmbus.contract.chunks.ChunkAssembler`, as the client library, `llmbus chat` and the gateway do)
was shown: one answer, never restarted, ended by a final chunk with no error, its text the result's; and,
token by token, that each leg's chunks carry exactly that leg's tokens and characters, so no span of the
answer was sent twice or left out (with the sim, whose tokens are one word each, the answer's words are its
tokens too). Docs: docs/delivery.md, "Continuation across legs"; docs/reliability.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from llmbus.audit import Seen
from llmbus.contract import topics as t
from llmbus.contract.chunks import ChunkAssembler
from llmbus.contract.messages import InferenceResult, TokenChunk

MAX_PROBLEMS = 10


def answer_problems(result: InferenceResult, chunks: list[TokenChunk], words_are_tokens: bool) -> list[str]:
    """Why a client following the chunk contract did not get `result`'s answer as one clean stream."""
    assembler = ChunkAssembler()
    for chunk in chunks:
        assembler.add(chunk)
    key = result.request_id
    problems = []
    if assembler.final is None:
        return [f"{key}: no final chunk reached the client"]
    if assembler.final.error is not None:
        problems.append(f"{key}: the stream ended with {assembler.final.error.code}")
    if assembler.restarts:
        problems.append(f"{key}: the client saw the answer restart {assembler.restarts} time(s)")
    if assembler.text != result.text:
        problems.append(f"{key}: the client's text ({len(assembler.text)} chars) is not the result's")
    answer = [c for segment in assembler.segments(assembler.attempt) for c in segment.chunks]
    tokens = sum(c.tokens for c in answer)
    if tokens != result.usage.completion_tokens:
        problems.append(f"{key}: the chunks carry {tokens} tokens, the result says {result.usage.completion_tokens}")
    if words_are_tokens and len(result.text.split()) != result.usage.completion_tokens:
        problems.append(f"{key}: {len(result.text.split())} words for {result.usage.completion_tokens} tokens")
    for number, leg in enumerate(result.legs or []):
        later = (result.legs or [])[number + 1 :]
        end = later[0].first_seq if later else (answer[-1].seq + 1 if answer else leg.first_seq)
        mine = [c for c in answer if leg.first_seq <= c.seq < end]
        sent = (sum(c.tokens for c in mine), sum(len(c.delta) for c in mine))
        if {c.attempt for c in mine} - {leg.attempt} or sent != (leg.completion_tokens, leg.text_chars):
            problems.append(f"{key}: leg {number} sent {sent} (tokens, chars), recorded {leg}")
    return problems


@dataclass
class Streams:
    """The answers' streams as their clients saw them (an Effect: `settle`, `check`)."""

    topics: t.Topics
    words_are_tokens: bool = True  # the sim's tokens are one word each
    continued: int = 0  # answers with more than one leg
    legs: dict[str, int] = field(default_factory=dict)  # why each continued leg ended → how many
    # why a leg ended → the client's wait at each such cut: its next leg's first chunk less the cut leg's last
    # chunk (record timestamps, ms)
    gaps_ms: dict[str, list[int]] = field(default_factory=dict)
    cut_on: dict[str, int] = field(default_factory=dict)  # the worker a cut leg ran on → how many
    gaps_on: dict[str, list[int]] = field(default_factory=dict)  # the waits of gaps_ms by the cut leg's worker

    async def settle(self, result_ids: set[str], timeout_s: float) -> None:
        return None  # judged on what the audit read: the answers are in

    async def check(self, records: list[Seen]) -> tuple[list[str], list[str]]:
        results: dict[tuple[str, str], InferenceResult] = {}
        chunks: dict[tuple[str, str], list[TokenChunk]] = defaultdict(list)
        written_ms: dict[tuple[str, str, int, int], int] = {}  # (tenant, request id, attempt, seq) → timestamp
        for record in _in_order(records):
            if record.value is None:
                continue
            if record.topic == self.topics.name(t.RESULTS):
                result = InferenceResult.model_validate_json(record.value)
                if not result.shadow:
                    results.setdefault((result.tenant, result.request_id), result)
            elif self._is_reply_topic(record.topic):
                chunk = TokenChunk.model_validate_json(record.value)
                chunks[(chunk.tenant, chunk.request_id)].append(chunk)
                if record.timestamp_ms is not None:
                    written_ms.setdefault(
                        (chunk.tenant, chunk.request_id, chunk.attempt, chunk.seq), record.timestamp_ms
                    )
        problems: list[str] = []
        for key, result in results.items():
            problems += answer_problems(result, chunks.get(key, []), self.words_are_tokens)
            if result.legs:
                self.continued += 1
                for leg, after in zip(result.legs, result.legs[1:], strict=False):
                    self.legs[leg.ended.value] = self.legs.get(leg.ended.value, 0) + 1
                    worker = leg.worker_id or "unknown"
                    self.cut_on[worker] = self.cut_on.get(worker, 0) + 1
                    last = written_ms.get((*key, leg.attempt, after.first_seq - 1))
                    first = written_ms.get((*key, after.attempt, after.first_seq))
                    if last is not None and first is not None:
                        self.gaps_ms.setdefault(leg.ended.value, []).append(first - last)
                        self.gaps_on.setdefault(worker, []).append(first - last)
        if not self.continued:
            problems.append("no answer was continued: the faults cut none mid-stream, the scenario tested nothing")
        notes = [
            f"streams: {len(results)} answers, {self.continued} continued across legs (cut legs by cause "
            f"{self.legs or 'none'}); {len(problems)} problems",
            *(
                f"streams: the client's wait at a {cause} cut, ms: {summary(gaps)}"
                for cause, gaps in self.gaps_ms.items()
            ),
        ]
        return problems[:MAX_PROBLEMS], notes

    def _is_reply_topic(self, topic: str) -> bool:
        """A client's reply topic: the default one, or a tenant's own (llm.replies.<tenant>, auth on)."""
        base = topic.removeprefix(self.topics.prefix)
        return base == t.TOKENS or base.startswith(t.REPLIES_PREFIX)


def summary(values_ms: list[int]) -> dict[str, int]:
    """n, median, 90th percentile and max of `values_ms` (nearest rank)."""
    ordered = sorted(values_ms)
    if not ordered:
        return {"n": 0}

    def rank(q: float) -> int:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    return {"n": len(ordered), "p50": rank(0.5), "p90": rank(0.9), "max": ordered[-1]}


def _in_order(records: Iterable[Seen]) -> list[Seen]:
    return sorted(records, key=lambda r: (r.topic, r.partition, r.offset))
