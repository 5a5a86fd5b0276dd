"""The legs of an answer (pure): the one running here, and those before it rebuilt from their chunks.

A leg is one engine run (docs/delivery.md, "Continuation across legs"). The worker records the leg it
runs from the engine's outputs (`LegRun`); the legs before it come from the continued answer's
chunks (`continuation_from`): each attempt's stretch, split where the model that wrote it changes
(an openai-http worker that went on with another model in its own process), named with the worker
and the end the scheduler recorded for that attempt (`Dispatch.earlier`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmbus.contract.chunks import SoFar
from llmbus.contract.messages import Continuation, EarlierAttempt, Leg, LegEnd, TokenChunk, TokenLogprob, leg_end_of
from llmbus_services.engine_worker.core.engine import EngineOutput


@dataclass
class LegRun:
    """The leg running here: fed every EngineOutput of one engine run (its counts are the run's own)."""

    attempt: int
    worker_id: str
    model: str
    first_seq: int
    started_at_ms: float
    deployment: str | None = None
    text_chars: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    ended_at_ms: float | None = None

    def add(self, out: EngineOutput, now_ms: float) -> None:
        if out.index == 0:
            self.text_chars += len(out.delta)
        self.prompt_tokens = out.prompt_tokens
        self.cached_prompt_tokens = out.cached_prompt_tokens
        self.completion_tokens = out.completion_tokens
        self.model = out.model or self.model
        self.deployment = out.deployment or self.deployment
        if out.new_tokens:
            self.ended_at_ms = now_ms

    def leg(self, ended: LegEnd, now_ms: float) -> Leg:
        return Leg(
            attempt=self.attempt,
            worker_id=self.worker_id,
            model=self.model,
            deployment=self.deployment,
            first_seq=self.first_seq,
            text_chars=self.text_chars,
            prompt_tokens=self.prompt_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens,
            completion_tokens=self.completion_tokens,
            started_at_ms=round(self.started_at_ms),
            ended_at_ms=round(self.ended_at_ms if self.ended_at_ms is not None else now_ms),
            ended=ended,
        )


def continuation_from(
    so_far: SoFar,
    earlier: Sequence[EarlierAttempt],
    written_ms: Mapping[tuple[int, int], int],
    prompt_tokens: int,
) -> Continuation:
    """The Continuation of an answer read back from its chunks. `prompt_tokens`: this worker's count of the
    request's prompt, which a leg read (with the answer before it) as its own prompt."""
    ends = {attempt.attempt: attempt for attempt in earlier}
    legs: list[Leg] = []
    before_tokens = 0
    runs = [run for segment in so_far.segments for run in _model_runs(segment.chunks)]
    for i, run in enumerate(runs):
        attempt = run[0].attempt
        last_of_attempt = i + 1 == len(runs) or runs[i + 1][0].attempt != attempt
        known = ends.get(attempt)
        tokens = sum(chunk.tokens for chunk in run)
        legs.append(
            Leg(
                attempt=attempt,
                worker_id=known.worker_id if known is not None else None,
                model=run[0].model,
                first_seq=run[0].seq,
                text_chars=sum(len(chunk.delta) for chunk in run),
                prompt_tokens=prompt_tokens + before_tokens,
                completion_tokens=tokens,
                started_at_ms=written_ms.get((attempt, run[0].seq)),
                ended_at_ms=written_ms.get((attempt, run[-1].seq)),
                ended=(leg_end_of(known.ended) if known is not None else LegEnd.FAILED)
                if last_of_attempt
                else LegEnd.UPSTREAM_FAILED,
            )
        )
        before_tokens += tokens
    chunks = so_far.chunks
    logprobs: list[TokenLogprob] = [lp for chunk in chunks for lp in chunk.logprobs or ()]
    return Continuation(
        text=so_far.text,
        logprobs=logprobs or None,
        completion_tokens=before_tokens,
        next_seq=so_far.next_seq,
        continues_attempt=so_far.attempt,
        legs=legs,
    )


def _model_runs(chunks: Sequence[TokenChunk]) -> list[list[TokenChunk]]:
    """`chunks` (one attempt's) cut where the model that wrote them changes."""
    runs: list[list[TokenChunk]] = []
    for chunk in chunks:
        if runs and runs[-1][-1].model == chunk.model:
            runs[-1].append(chunk)
        else:
            runs.append([chunk])
    return runs


def answer_usage(legs: Sequence[Leg]) -> tuple[int, int, int]:
    """(prompt, cached prompt, completion) tokens of an answer made of `legs`, as its client is told: the
    prompt as the first leg read it, every leg's answer tokens."""
    first = legs[0]
    return first.prompt_tokens, first.cached_prompt_tokens, sum(leg.completion_tokens for leg in legs)
