"""The final result of an attempt (pure): its answer (with the continued answer before it, if any), usage,
timings, legs and where it ran."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmbus.contract.messages import (
    Continuation,
    Dispatch,
    ErrorCode,
    ErrorInfo,
    FinishReason,
    InferenceResult,
    Leg,
    ResultStatus,
    Timings,
    Usage,
    now_ms,
)
from llmbus_services.engine_worker.core.answer import Answer
from llmbus_services.engine_worker.core.legs import answer_usage


@dataclass(frozen=True)
class RunSite:
    """Where this worker's requests run, recorded in each result (`llmbus trace` shows it)."""

    worker_id: str = ""
    produced_by: str = ""
    node_id: str | None = None
    gpu: str | None = None
    model_version: str | None = None
    model_format: str | None = None


def error_result(dispatch: Dispatch, error: ErrorInfo, site: RunSite) -> InferenceResult:
    routed = dispatch.routed
    return InferenceResult(
        request_id=routed.request_id,
        tenant=routed.request.tenant,
        status=ResultStatus.ERROR,
        error=error,
        finish_reason=FinishReason.ERROR,
        model=routed.model,
        worker_id=site.worker_id,
        shadow=routed.shadow,
        experiment_id=routed.experiment_id,
        variant=routed.variant,
        attempt=dispatch.attempt,
        produced_by=site.produced_by,
        **routed.facts(),
    )


def answer_result(
    dispatch: Dispatch,
    answer: Answer,
    started_ms: float,
    site: RunSite,
    continuation: Continuation | None = None,
    legs: Sequence[Leg] = (),
    finish_reason: FinishReason | None = None,
) -> InferenceResult:
    """The result of an answer this attempt ended: its own text after the continued text before it.
    `legs`: every leg of the answer when it has more than one (the continued ones, then this attempt's)."""
    routed = dispatch.routed
    done_ms = now_ms()
    received = routed.received_at_ms
    last = answer.last
    first_token_ms = answer.first_token_ms
    if continuation is not None and continuation.legs and continuation.legs[0].started_at_ms is not None:
        first_token_ms = continuation.legs[0].started_at_ms  # the client's first token came in the first leg
    if len(legs) > 1:
        prompt, cached, completion = answer_usage(legs)
    else:
        prompt = last.prompt_tokens if last else 0
        cached = last.cached_prompt_tokens if last else 0
        completion = last.completion_tokens if last else 0
    timings = Timings(
        received_at_ms=received,
        queued_ms=round(started_ms - received, 3),
        ttft_ms=round(first_token_ms - received, 3) if first_token_ms else None,
        total_ms=round(done_ms - received, 3),
        engine_ms=round(done_ms - started_ms, 3),
        tpot_ms=round((done_ms - first_token_ms) / (completion - 1), 3) if first_token_ms and completion > 1 else None,
    )
    first = answer.first
    prefix = continuation.text if continuation is not None else ""
    prefix_logprobs = (continuation.logprobs or []) if continuation is not None else []
    logprobs = [*prefix_logprobs, *first.logprobs]
    return InferenceResult(
        request_id=routed.request_id,
        tenant=routed.request.tenant,
        status=ResultStatus.ERROR if answer.aborted else ResultStatus.OK,
        error=ErrorInfo.of(ErrorCode.CANCELLED, "cancelled by the client") if answer.aborted else None,
        model=routed.model,
        worker_id=site.worker_id,
        text=prefix + "".join(first.text),
        tool_calls=first.tool_calls(),
        finish_reason=finish_reason or answer.finish_reason(),
        logprobs=logprobs or None,
        choices=answer.other_choices(),
        usage=Usage(prompt_tokens=prompt, completion_tokens=completion, cached_prompt_tokens=cached),
        timings=timings,
        shadow=routed.shadow,
        experiment_id=routed.experiment_id,
        variant=routed.variant,
        trimmed_tokens=routed.trimmed_tokens,
        max_tokens_requested=routed.max_tokens_requested,
        attempt=dispatch.attempt,
        produced_by=site.produced_by,
        completed_at_ms=now_ms(),
        node_id=site.node_id,
        gpu=site.gpu,
        model_version=site.model_version,
        model_format=site.model_format,
        preemptions=last.preemptions if last else 0,
        legs=list(legs) if len(legs) > 1 else None,
        **routed.facts(),
    )
