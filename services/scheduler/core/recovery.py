"""Recovery decisions: what happens to a request when its attempt fails or its worker dies.

A retryable failure (over capacity, OOM, engine failure, handed back, worker lost) is
placed again as attempt + 1 on another worker when there is one; after `max_attempts`
the request gets a final MAX_ATTEMPTS error. A failure whose error is not retryable (an
upstream 4xx, a validation error) is final at once: the same request fails everywhere.
When the worker's upstream was busy (429/503, `retry_after_ms`), the retry waits a backoff
that doubles per attempt. An OOM is retried once at most (`max_oom_retries`), and only on a
worker with more free KV than the failed one had (the core sets that bound): the same request on
an equally full worker would run out of memory again, and a second OOM ends it as `engine_oom`.
An attempt whose text the answer so far continues (a leg of it) is not counted: legs are bounded by the
answer's `migration_limit`, which its next worker enforces. The scheduler does not see chunks, so a GiveUp
of max_attempts carries what failed (`failed`), and the flow, having read the request's reply topic, asks
again with the legs it found (`retry_legs`) before the error goes out.
Every path ends in a placement or a final result, so no request is left without an answer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmbus.contract.messages import EarlierAttempt, ErrorCode, ErrorInfo, OutcomeStatus
from llmbus_services.scheduler.core.types import Placement, SchedRequest


@dataclass
class Retry:
    request: SchedRequest  # already attempt + 1, the failed worker excluded
    reason: ErrorCode


@dataclass
class GiveUp:
    request: SchedRequest
    error: ErrorInfo
    # A max_attempts GiveUp: the attempt that failed, and how (`retry_legs` decides again from them).
    failed: Placement | None = None
    reason: ErrorCode | None = None
    message: str = ""


@dataclass
class Done:
    """The attempt ended for good (completed, or the worker published the final error)."""

    placement: Placement


RecoveryDecision = Retry | GiveUp | Done


@dataclass
class RecoveryPolicy:
    max_attempts: int = 3
    heartbeat_timeout_ms: int = 5_000
    busy_backoff_ms: int = 100  # first retry after an upstream 429/503; doubles per attempt
    busy_backoff_max_ms: int = 5_000
    max_oom_retries: int = 1

    def backoff_ms(self, failed_attempt: int) -> int:
        return min(self.busy_backoff_max_ms, self.busy_backoff_ms * 2 ** max(0, failed_attempt - 1))

    def retry(self, placement: Placement, reason: ErrorCode, message: str = "") -> Retry | GiveUp:
        request = placement.request
        if request.attempts_here - request.legs_forgiven >= self.max_attempts:
            detail = f"{placement.attempt} attempts failed; last on {placement.worker_id}: {reason.value} {message}"
            error = ErrorInfo.of(ErrorCode.MAX_ATTEMPTS, detail.strip())
            return GiveUp(request, error, failed=placement, reason=reason, message=message)
        ended = EarlierAttempt(attempt=placement.attempt, worker_id=placement.worker_id, ended=reason)
        again = replace(
            request,
            attempt=placement.attempt + 1,
            excluded_workers=request.excluded_workers | {placement.worker_id},
            earlier=[*request.earlier, ended],
        )
        return Retry(again, reason)

    def retry_legs(self, gave_up: GiveUp, legs: set[int]) -> Retry | GiveUp:
        """`gave_up` (max_attempts) again, knowing `legs`: the attempts whose text the answer so far continues
        (read from its reply topic). Those under the request's model now are not counted: it is retried if that
        leaves it an attempt, else it gives up as before."""
        placement = gave_up.failed
        if placement is None or gave_up.reason is None:
            return gave_up
        request = placement.request
        first_here = request.attempt - request.attempts_here  # attempts under an earlier model are not these
        forgiven = len({attempt for attempt in legs if first_here < attempt <= placement.attempt})
        counted = replace(request, legs_forgiven=max(request.legs_forgiven, forgiven))
        return self.retry(replace(placement, request=counted), gave_up.reason, gave_up.message)

    def on_outcome(self, placement: Placement, status: OutcomeStatus, error: ErrorInfo | None) -> RecoveryDecision:
        if status == OutcomeStatus.RETRYABLE:
            if error is not None and not error.retryable:
                return GiveUp(placement.request, error)  # retrying cannot help (e.g. invalid_request)
            code = error.code if error is not None else ErrorCode.ENGINE_FAILED
            message = error.message if error is not None else ""
            if code == ErrorCode.ENGINE_OOM:
                return self._retry_oom(placement, message)
            return self.retry(placement, code, message)
        # COMPLETED / FAILED (the worker wrote the final result) / DUPLICATE: nothing more to do.
        return Done(placement)

    def _retry_oom(self, placement: Placement, message: str) -> Retry | GiveUp:
        request = placement.request
        if request.oom_retries >= self.max_oom_retries:
            where = f"{placement.worker_id} (attempt {placement.attempt})"
            detail = f"out of memory on {where}, after {request.oom_retries} OOM retry: {message}"
            return GiveUp(request, ErrorInfo(code=ErrorCode.ENGINE_OOM, message=detail[:2000], retryable=False))
        decision = self.retry(placement, ErrorCode.ENGINE_OOM, message)
        if isinstance(decision, Retry):
            decision.request.oom_retries = request.oom_retries + 1
        return decision

    def on_worker_lost(self, placements: list[Placement]) -> list[Retry | GiveUp]:
        return [self.retry(p, ErrorCode.WORKER_LOST, "no heartbeat") for p in placements]
