"""One request's tries of a model's deployments: how often it tried each, which it may not try again, and
when it may try one again (a Retry-After it waits out, a backoff). Legs of its answer that an earlier run of
this engine ended on a deployment count as tries of it (`EngineRequest.continuation.legs`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from llmbus.contract.messages import LegEnd
from llmbus_services.engine_worker.adapters.engines.openai_deployments import Deployment
from llmbus_services.engine_worker.adapters.engines.openai_failures import FailureKind, TryFailure
from llmbus_services.engine_worker.adapters.engines.openai_http_config import OpenAIHttpConfig
from llmbus_services.engine_worker.core.engine import EngineRequest

log = logging.getLogger(__name__)


@dataclass
class Tries:
    retries: int  # tries again on one deployment after a failure that may pass
    counts: dict[str, int] = field(default_factory=dict)
    excluded: set[str] = field(default_factory=set)  # may not be tried again
    not_before: dict[str, float] = field(default_factory=dict)  # may be tried again from then (monotonic)

    @classmethod
    def of(cls, request: EngineRequest, deployments: list[Deployment], retries: int) -> Tries:
        """The tries the answer's earlier legs in this process made (each cut one failed its deployment)."""
        tries = cls(retries)
        names = {d.name for d in deployments}
        for leg in request.continuation.legs if request.continuation is not None else ():
            if leg.deployment in names and leg.ended != LegEnd.COMPLETED:
                tries.counts[leg.deployment] = tries.counts.get(leg.deployment, 0) + 1
        tries.excluded = {name for name, n in tries.counts.items() if n > retries}
        return tries

    def start(self, deployment: Deployment) -> None:
        self.counts[deployment.name] = self.counts.get(deployment.name, 0) + 1

    def failed(self, deployment: Deployment, failure: TryFailure, config: OpenAIHttpConfig, now_s: float) -> None:
        """A try's failure: the deployment's health (its breaker, or its cooldown when busy), and whether and
        when this request may try it again: past `retries`, after a failure trying again cannot help, or
        after a Retry-After over `max_retry_after_s`, never."""
        name = deployment.name
        mid = " (mid-answer)" if failure.mid_answer else ""
        log.warning("upstream %s (%s): %s%s", name, failure.kind.value, failure, mid)
        wait_s = config.retry_backoff_s
        if failure.kind == FailureKind.BUSY:
            wait_s = config.busy_cooldown_s if failure.retry_after_s is None else failure.retry_after_s
            deployment.busy_for(now_s, wait_s)
        elif not failure.final:
            deployment.breaker.record_failure(str(failure))
        if failure.retries_here and self.counts[name] <= self.retries and wait_s <= config.max_retry_after_s:
            self.not_before[name] = now_s + wait_s
        else:
            self.excluded.add(name)
