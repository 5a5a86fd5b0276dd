"""Committing offsets without letting a rebalance or a broker blip stop the service.

Three kinds of failure, three answers:
- the group moved on (CommitFailedError after a rebalance, partitions no longer assigned):
  nothing to retry. The offsets stay uncommitted; whoever owns the partitions now resumes
  from the last commit, so the records are redelivered, never skipped.
- the broker is slow or away (timeouts, retriable Kafka errors): retried with backoff for
  up to `timeout_s`; if it is still failing the commit is left for the next interval.
- anything else (authorisation, a broken request): raised; the service exits and restarts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from prometheus_client import Counter
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

log = logging.getLogger(__name__)

COMMIT_FAILURES = Counter(
    "llmbus_commit_failures_total", "Offset commits that did not happen (left for later)", ["service", "reason"]
)


def retriable(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError):
        return True
    return isinstance(exc, KafkaError) and bool(exc.retriable) and not isinstance(exc, CommitFailedError)


async def commit_with_retry(commit: Callable[[], Awaitable[None]], timeout_s: float, service: str) -> bool:
    """Run `commit` until it succeeds (True), the group has moved on or `timeout_s` is spent (False).

    Raises only errors that retrying cannot fix.
    """
    deadline = time.monotonic() + timeout_s
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_delay(timeout_s),
            wait=wait_exponential(multiplier=0.05, max=1.0),
            retry=retry_if_exception(retriable),
            reraise=True,
        ):
            with attempt:
                await asyncio.wait_for(commit(), max(0.05, deadline - time.monotonic()))
    except (CommitFailedError, IllegalStateError) as exc:
        log.warning("commit dropped, the group rebalanced (%s): the partitions' owner resumes from the last one", exc)
        COMMIT_FAILURES.labels(service, "rebalanced").inc()
        return False
    except Exception as exc:
        if not retriable(exc):
            raise
        log.warning("commit failed for %.1fs (%r): left for the next interval", timeout_s, exc)
        COMMIT_FAILURES.labels(service, "retriable").inc()
        return False
    return True
