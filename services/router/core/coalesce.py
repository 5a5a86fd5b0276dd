"""Request coalescing, the pure part: what a follower gets once its leader's generation ends.

Identical cacheable requests (same exact-cache key: tenant, model, input, parameters) that are
in flight together share one generation. The first to miss the cache leads and is routed as
usual; the others are parked behind it (in Redis, services/router/adapters/coalescing.py). When the
leader's final InferenceResult reaches the router on llm.results, each follower gets either:

- ANSWER: the leader's text as its own stream and result, billed as a cache hit (`cached`);
- ERROR: the leader's error, when that error follows from the input itself (a follower would
  fail the same way: `share_error_codes`);
- GENERATE: its own routed request, sent on to the scheduler, for any other failure (deadline,
  lost worker, cancel, exhausted attempts: those belong to the leader, not to the input), and
  when the leader's answer is tool calls (an answer replays text only).

A follower whose leader gives no result within `max_wait_s` (lost result, expired state) also
GENERATEs: no follower waits forever. No broker imports here.
"""

from __future__ import annotations

from enum import StrEnum

from llmbus.contract.messages import (
    ErrorInfo,
    FinishReason,
    InferenceResult,
    ResultStatus,
    RoutedRequest,
    Timings,
    now_ms,
)
from llmbus_services.router.core.config import CoalescePolicy
from llmbus_services.router.core.pipeline import PRODUCED_BY, RouteOutcome, answered_from
from llmbus_services.router.core.ports import CachedAnswer

COALESCED = "coalesced"  # route_reason prefix of a follower's answer
FALLBACK = "coalesce_fallback"  # route_reason prefix of a follower sent to its own generation


class FollowerVerdict(StrEnum):
    ANSWER = "answer"
    ERROR = "error"
    GENERATE = "generate"


def verdict_on(leader: InferenceResult, policy: CoalescePolicy) -> FollowerVerdict:
    if leader.status == ResultStatus.OK:
        # A follower's answer replays text only: tool calls are not handed on, the follower generates.
        return FollowerVerdict.GENERATE if leader.tool_calls else FollowerVerdict.ANSWER
    if leader.error is not None and leader.error.code in policy.share_error_codes:
        return FollowerVerdict.ERROR
    return FollowerVerdict.GENERATE


def follower_answer(follower: RoutedRequest, leader: InferenceResult) -> RouteOutcome:
    """The leader's text as the follower's own complete stream and result (a cache hit)."""
    hit = CachedAnswer(
        text=leader.text, usage=leader.usage, model=leader.model or follower.model, finish_reason=leader.finish_reason
    )
    return answered_from(follower, hit, f"{COALESCED}:{leader.request_id}:{follower.route_reason}")


def follower_error(follower: RoutedRequest, leader: InferenceResult) -> RouteOutcome:
    """The leader's error (one that the follower's identical input would meet too) as the follower's result."""
    assert leader.error is not None
    request = follower.request
    result = InferenceResult(
        request_id=request.request_id,
        tenant=request.tenant,
        status=ResultStatus.ERROR,
        error=ErrorInfo(
            code=leader.error.code,
            message=f"{leader.error.message} (coalesced with {leader.request_id})"[:2000],
            retryable=leader.error.retryable,
            retry_after_ms=leader.error.retry_after_ms,
        ),
        finish_reason=FinishReason.ERROR,
        model=follower.model,
        timings=Timings(received_at_ms=follower.received_at_ms, total_ms=float(now_ms() - follower.received_at_ms)),
        experiment_id=follower.experiment_id,
        variant=follower.variant,
        produced_by=PRODUCED_BY,
        **follower.facts(f"{COALESCED}:{leader.request_id}:{follower.route_reason}"),
    )
    return RouteOutcome(result=result)


def own_generation(follower: RoutedRequest, why: str) -> RoutedRequest:
    """The follower routed on its own after all; `why`: leader_failed:<code> | timeout."""
    return follower.model_copy(
        update={"route_reason": f"{FALLBACK}:{why}:{follower.route_reason}", "routed_at_ms": now_ms()}
    )


def outcome_for(follower: RoutedRequest, leader: InferenceResult, policy: CoalescePolicy) -> RouteOutcome:
    """What to publish for one follower when its leader's result is in."""
    verdict = verdict_on(leader, policy)
    if verdict == FollowerVerdict.ANSWER:
        return follower_answer(follower, leader)
    if verdict == FollowerVerdict.ERROR:
        return follower_error(follower, leader)
    if leader.status == ResultStatus.OK:
        return RouteOutcome(routed=own_generation(follower, "leader_tool_calls"))
    code = leader.error.code.value if leader.error is not None else "unknown"
    return RouteOutcome(routed=own_generation(follower, f"leader_failed:{code}"))
