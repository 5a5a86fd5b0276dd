"""A continued answer: its legs, and how the chunks of a leg continue the ones before them.

An answer cut mid-stream (its worker SIGKILLed, drained, out of memory; its hosted upstream cut or
stalled) is continued by the next leg from exactly what its client was sent: the prompt plus that text
as the start of the assistant's answer, the rest of max_tokens, the same sampling parameters and seed.
docs/delivery.md ("Continuation across legs") has the whole contract; these are its values:

- `Continuation`: what the next leg continues from (the engine's input: `EngineRequest.continuation`);
- `Leg`: one stretch of the answer, as the final result records it (`InferenceResult.legs`);
- `ContinuedFrom`: on every chunk of an attempt that continues an earlier one (`TokenChunk.continues`);
- `EarlierAttempt`: what the scheduler knows of a request's earlier attempts (`Dispatch.earlier`).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from llmbus.contract.messages.base import Part
from llmbus.contract.messages.chat import TokenLogprob
from llmbus.contract.messages.errors import ErrorCode

# Legs of one answer unless the request says otherwise (InferenceRequest.migration_limit): three
# continuations, more than a request meets when each fault is a rare event.
DEFAULT_MIGRATION_LIMIT = 4


class LegEnd(StrEnum):
    """Why a leg of an answer ended: the cause of the continuation that follows it."""

    COMPLETED = "completed"  # the answer ended in it (the last leg)
    WORKER_LOST = "worker_lost"  # its worker died or fell silent (SIGKILL, a crash, a zombie)
    DRAINED = "drained"  # its worker drained (scale-down, SIGTERM, Control(drain)) and handed it over
    ENGINE_OOM = "engine_oom"  # the engine ran out of memory for it
    ENGINE_FAILED = "engine_failed"  # the engine died, or failed it for a reason of its own
    UPSTREAM_FAILED = "upstream_failed"  # a hosted upstream cut, stalled or failed mid-answer
    FAILED = "failed"  # any other failure a later attempt could get past


_LEG_END_OF_CODE = {
    ErrorCode.WORKER_LOST: LegEnd.WORKER_LOST,
    ErrorCode.HANDED_BACK: LegEnd.DRAINED,
    ErrorCode.ENGINE_OOM: LegEnd.ENGINE_OOM,
    ErrorCode.ENGINE_FAILED: LegEnd.ENGINE_FAILED,
    ErrorCode.OVER_CAPACITY: LegEnd.UPSTREAM_FAILED,  # an upstream's 429/503 mid-answer
}


def leg_end_of(code: ErrorCode | None) -> LegEnd:
    """The LegEnd of an attempt that ended with `code` (its outcome's error, or worker_lost)."""
    return _LEG_END_OF_CODE.get(code, LegEnd.FAILED) if code is not None else LegEnd.FAILED


class Leg(Part):
    """One stretch of an answer produced by one engine run: one attempt on a worker, or one upstream
    inside an attempt of an openai-http worker (which continues in its own process). Its chunks are the
    answer's seqs from `first_seq` up to the next leg's first seq."""

    attempt: int = Field(ge=0, description="The attempt whose chunks carry it.")
    worker_id: str | None = Field(default=None, description="Its worker; None: not known (read back, no record).")
    model: str | None = Field(default=None, description="The model that generated it (a hosted leg: the upstream's).")
    deployment: str | None = Field(
        default=None, description="A hosted leg: the upstream deployment that served it; None: the worker's engine."
    )
    first_seq: int = Field(default=0, ge=0, description="Its first chunk's seq.")
    text_chars: int = Field(default=0, ge=0, description="Characters of the answer it produced.")
    prompt_tokens: int = Field(
        default=0, ge=0, description="What its engine read: the prompt and the answer before it (its billed input)."
    )
    cached_prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0, description="The answer's tokens it generated (its chunks').")
    started_at_ms: int | None = Field(default=None, description="When its engine run began (read back: its 1st chunk).")
    ended_at_ms: int | None = Field(default=None, description="Its last token (a read-back leg: its last chunk).")
    ended: LegEnd = LegEnd.COMPLETED


class Continuation(Part):
    """What the next leg of an answer continues from: exactly what the client was sent of it, never more
    or less. Built by the worker that runs the next leg, from the reply topic (after a death, a drain, an
    OOM: the chunks are the client's truth) or from its own stream (an engine continuing in process)."""

    text: str = Field(default="", description="The answer so far (its first choice), as the client received it.")
    logprobs: list[TokenLogprob] | None = Field(
        default=None, description="The log-probabilities sent with that text (a request with logprobs)."
    )
    completion_tokens: int = Field(default=0, ge=0, description="The tokens of that text, as its legs counted them.")
    next_seq: int = Field(default=0, ge=0, description="The seq of the answer's next chunk.")
    continues_attempt: int = Field(default=0, ge=0, description="The attempt whose chunks the next leg continues.")
    legs: list[Leg] = Field(default_factory=list, description="The legs so far, in order; the last one just ended.")

    @property
    def ended(self) -> LegEnd:
        """Why the last leg ended: the continuation's cause."""
        return self.legs[-1].ended if self.legs else LegEnd.FAILED


class ContinuedFrom(Part):
    """On every chunk of an attempt that continues an earlier one: the earlier attempt's chunks before
    `seq` (themselves maybe a continuation) are the start of this attempt's answer, and this attempt's
    chunks are numbered from `seq` on. A reader that has shown exactly that shows one seamless answer."""

    attempt: int = Field(ge=0, description="The attempt continued.")
    seq: int = Field(ge=0, description="This attempt's first seq: where the continued attempt's text is cut.")


class EarlierAttempt(Part):
    """One attempt the scheduler placed before this one: where it ran and how it ended."""

    attempt: int = Field(ge=1)
    worker_id: str
    ended: ErrorCode = Field(description="Its outcome's error code, or worker_lost.")
