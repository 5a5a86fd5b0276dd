"""Recovery decisions: what happens to a request when its attempt fails or its worker dies.

A retryable failure (over capacity, OOM, engine failure, handed back, worker lost) is
placed again as attempt + 1 on another worker when there is one; after `max_attempts`
the request gets a final MAX_ATTEMPTS error. A failure whose error is not retryable (an
upstream 4xx, a validation error) is final at once: the same request fails everywhere.
When the worker's upstream was busy (429/503, `retry_after_ms`), the retry waits a backoff
that doubles per attempt. An OOM is retried once at most (`max_oom_retries`), and only on a
worker with more free KV than the failed one had (the core sets that bound): the same request on
an equally full worker would run out of memory again, and a second OOM ends it as `engine_oom`.
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
        if request.attempts_here >= self.max_attempts:
            detail = f"{placement.attempt} attempts failed; last on {placement.worker_id}: {reason.value} {message}"
            return GiveUp(request, ErrorInfo.of(ErrorCode.MAX_ATTEMPTS, detail.strip()))
        ended = EarlierAttempt(attempt=placement.attempt, worker_id=placement.worker_id, ended=reason)
        again = replace(
            request,
            attempt=placement.attempt + 1,
            excluded_workers=request.excluded_workers | {placement.worker_id},
            earlier=[*request.earlier, ended],
        )
        return Retry(again, reason)

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
