"""How one try (one HTTP request to one deployment) failed, and what that allows next.

The kinds, from what the upstream did, and what may follow:

- `busy`: 429 or 503. The same deployment after its Retry-After if that is short enough, else another.
- `transient`: another 5xx, a refused or reset connection, a 200 with no answer in it. The same deployment
  again after a backoff, or another.
- `stalled`: no first token in time, or a silence between tokens. Another deployment.
- `broken`: the stream cut, malformed, or an error event. Another deployment (or this one); after tokens
  went out, the leg ends and the next one continues the answer.
- `rejected`: 400, 404, 413, 422, the request itself is wrong. Nothing: the request's final error.
- `too_long`: `context_length_exceeded`. Nothing here: the next model of the chain whose window fits.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from enum import StrEnum

from llmbus.contract.messages import ErrorCode
from llmbus_services.engine_worker.core.engine import EngineError, RequestRejected, UpstreamBusy, UpstreamFailed


class FailureKind(StrEnum):
    BUSY = "busy"
    TRANSIENT = "transient"
    STALLED = "stalled"
    BROKEN = "broken"
    REJECTED = "rejected"
    TOO_LONG = "too_long"


@dataclass
class TryFailure(Exception):
    """One try's failure; `mid_answer`: tokens of this try had already streamed."""

    kind: FailureKind
    message: str
    retry_after_s: float | None = None  # busy: what the upstream said (None: it did not)
    prompt_tokens: int = 0  # too_long: the upstream's count of the prompt, where it says it
    param: str | None = None  # rejected: the request's parameter at fault, where it says it
    mid_answer: bool = False

    def __str__(self) -> str:
        return self.message

    @property
    def retries_here(self) -> bool:
        """Whether trying the same deployment again can help (a Retry-After bound applies to busy)."""
        return self.kind in (FailureKind.BUSY, FailureKind.TRANSIENT, FailureKind.BROKEN)

    @property
    def final(self) -> bool:
        """No deployment of this model can answer the request."""
        return self.kind in (FailureKind.REJECTED, FailureKind.TOO_LONG)


def retry_after_s(value: str | None, default_s: float | None, now_s: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date; `default_s` if absent."""
    if not value:
        return default_s
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default_s
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))


# The prompt's count in the upstream's words: OpenAI's "... However, your messages resulted in 9013 tokens";
# vLLM's "... you requested 9013 tokens (8013 in the messages, 1000 in the completion)" and "... your request
# has 9013 input tokens".
_PROMPT_COUNT = re.compile(r"resulted in (\d+) tokens|(\d+) in the messages|has (\d+) input tokens")


def status_failure(status: int, body: str, retry_after: str | None) -> TryFailure:
    """The failure an HTTP status (not 200) before any answer says."""
    error = _error_object(body)
    message = f"upstream HTTP {status}: {(error.get('message') or body)[:300]}"
    code = str(error.get("code") or "")
    if status in (429, 503):
        return TryFailure(FailureKind.BUSY, message, retry_after_s(retry_after, None))
    if code == "context_length_exceeded" or (status == 400 and "maximum context length" in message):
        return TryFailure(FailureKind.TOO_LONG, message, prompt_tokens=_prompt_count(message))
    if status in (400, 404, 413, 422):
        return TryFailure(FailureKind.REJECTED, message, param=error.get("param"))
    return TryFailure(FailureKind.TRANSIENT, message)


def _error_object(body: str) -> dict[str, str]:
    try:
        parsed = json.loads(body)
    except ValueError:
        return {}
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        return {k: str(v) for k, v in error.items() if v is not None}
    return {"message": str(error)} if error else {}


def _prompt_count(message: str) -> int:
    found = _PROMPT_COUNT.search(message)
    return int(next(g for g in found.groups() if g)) if found else 0


def engine_error(
    failure: TryFailure,
    prompt_tokens: int = 0,
    busy_cooldown_s: float = 1.0,
    free_in_s: float | None = None,
    broke_off: str | None = None,
) -> EngineError:
    """What the worker hears when no deployment can take the next try after `failure`: a wrong request is its
    final error; the rest go back to the scheduler (UpstreamFailed), with the prompt's count when it is over
    the upstream's window and when to try again when it is known (`free_in_s`: the first deployment free).
    `broke_off`: what the answer had when it could not go on (its tokens went out)."""
    if failure.kind == FailureKind.REJECTED:
        return RequestRejected(failure.message, failure.param)
    if failure.kind == FailureKind.TOO_LONG:
        count = max(failure.prompt_tokens, prompt_tokens)
        return UpstreamFailed(failure.message, ErrorCode.PROMPT_TOO_LONG, prompt_tokens=count)
    message = f"{broke_off}: {failure.message}" if broke_off else failure.message
    if failure.kind == FailureKind.BUSY:
        wait_s = free_in_s if free_in_s is not None else failure.retry_after_s
        return UpstreamBusy(message, busy_cooldown_s if wait_s is None else wait_s)
    return UpstreamFailed(message, retry_after_s=free_in_s)
