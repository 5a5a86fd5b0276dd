"""The scheduler's decisions in one object, driven by plain calls and a clock passed in.

Handlers call `submit` (llm.routed), `on_heartbeat` (llm.workers), `on_node`, `on_model`,
`on_outcome` (llm.outcomes) and `tick` (a timer); each returns actions for them to
publish: `PlaceAction` → a Dispatch on llm.dispatch.<worker>, `FinalError` → a final
InferenceResult on llm.results. The benchmark drives the very same object in virtual time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from llmbus.contract.messages import (
    ErrorCode,
    ErrorInfo,
    ModelSpec,
    NodeProfile,
    OutcomeStatus,
    WorkerState,
    WorkerStatus,
)
from llmbus.contract.request_key import RequestKey
from llmbus_services.scheduler.core.fleet import FleetView
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.plugins import CycleState
from llmbus_services.scheduler.core.plugins.filters_health import never_fits
from llmbus_services.scheduler.core.prefix_index import PrefixIndex, SessionIndex
from llmbus_services.scheduler.core.queue import FlowQueues
from llmbus_services.scheduler.core.recovery import GiveUp, RecoveryPolicy, Retry
from llmbus_services.scheduler.core.types import Placement, SchedRequest


@dataclass
class PlaceAction:
    placement: Placement

    @property
    def request(self) -> SchedRequest:
        return self.placement.request


@dataclass
class FinalError:
    request: SchedRequest
    error: ErrorInfo
    # The request's attempt ran on a worker (it gave up after it, or its worker was lost) and may have
    # streamed: the error goes out as the next attempt, so that its final chunk (seq 0) cannot collide with
    # a chunk that attempt sent, and every reader drops the attempt's text and ends on the error.
    ran: bool = False
    # A max_attempts error: the decision, which the flow takes again (`retry_legs`) once it has read which
    # attempts' text the answer so far continues, before the error goes out.
    gave_up: GiveUp | None = None


Action = PlaceAction | FinalError


@dataclass
class CoreConfig:
    max_attempts: int = 3
    heartbeat_timeout_ms: int = 5_000
    max_queued_per_model: int = 1_000
    max_queued_per_tenant: int | None = None  # waiting requests of one tenant over all models
    max_wait_ms: int = 60_000  # queue wait limit for requests without a deadline
    release_max_misses: int = 8
    prefix_index_max_blocks: int = 200_000  # at least; grows to what the fleet's KV tiers hold
    prefix_index_ttl_ms: int = 10 * 60_000
    seed: int | None = None
    prefix_block_tokens: int = 16  # tokens per hash of SchedRequest.prefix_block_hashes
    prefill_tokens_per_s: float = 50_000.0  # one worker's prefill rate, for the backlog estimate


@dataclass
class CoreStats:
    placed: int = 0
    queued: int = 0
    retried: int = 0
    workers_lost: int = 0
    final_errors: dict[str, int] = field(default_factory=dict)


class SchedulerCore:
    def __init__(self, pipeline: Pipeline, config: CoreConfig | None = None) -> None:
        self.pipeline = pipeline
        self.config = config or CoreConfig()
        self.fleet = FleetView(self.config.prefill_tokens_per_s)
        self.prefix_index = PrefixIndex(self.config.prefix_index_max_blocks, self.config.prefix_index_ttl_ms)
        self.sessions = SessionIndex()
        self.queues = FlowQueues(
            self.config.max_queued_per_model, self.config.max_wait_ms, self.config.max_queued_per_tenant
        )
        self.delayed: dict[RequestKey, SchedRequest] = {}  # retries waiting out a backoff (not_before_ms)
        self.recovery = RecoveryPolicy(self.config.max_attempts, self.config.heartbeat_timeout_ms)
        self.model_specs: dict[str, ModelSpec] = {}
        self.rng = random.Random(self.config.seed)
        self.stats = CoreStats()
        self.watching_since_ms: int | None = None  # first tick's clock: liveness grace after a restart

    # -- inputs ---------------------------------------------------------------------------
    def submit(self, request: SchedRequest, now_ms: int) -> list[Action]:
        """A new routed request (or a retry): place it now, queue it, or answer with an error."""
        if self.holds(request):
            return []  # a redelivered record we already hold
        if request.arrived_at_ms <= 0:
            request.arrived_at_ms = now_ms  # the queue's wait limit counts from here
        return self._admit(request, now_ms, force=False)

    def holds(self, request: SchedRequest) -> bool:
        """Placed, queued or waiting to be retried here."""
        key = request.key
        return self.fleet.placement_of(key) is not None or self.queues.holds(request.model, key) or key in self.delayed

    def on_heartbeat(self, status: WorkerStatus, now_ms: int, replayed: bool = False) -> list[Action]:
        known = self.fleet.workers.get(status.worker_id)
        restarted = not replayed and known is not None and 0 < known.started_at_ms < status.started_at_ms
        self.fleet.on_heartbeat(status, now_ms, replayed)
        self._size_prefix_index()
        actions: list[Action] = []
        if status.state == WorkerState.STOPPED:
            actions += self._lose_worker(status.worker_id, now_ms)
        elif restarted:
            # The id restarted (a crash, SIGKILL, OOM kill, then a supervisor): what its earlier process ran is
            # lost now, not when its dispatches come back to the new process once the old one's group
            # membership has timed out. Their next attempts continue what they streamed (docs/delivery.md).
            lost = self.fleet.placed_before(status.worker_id, status.started_at_ms)
            self.stats.workers_lost += bool(lost)
            for decision in self.recovery.on_worker_lost(lost):
                actions += self._follow(decision, now_ms)
        return actions + self._release(now_ms)

    def on_node(self, profile: NodeProfile) -> None:
        self.fleet.on_node(profile)

    def _size_prefix_index(self) -> None:
        """Let the index remember as many prompt blocks as the fleet's KV tiers (GPU + offload) hold."""
        tokens = sum(
            (w.kv_blocks_total + w.kv_offload_blocks_total) * w.kv_block_size for w in self.fleet.workers.values()
        )
        fleet_blocks = tokens // self.config.prefix_block_tokens
        self.prefix_index.max_blocks = max(self.config.prefix_index_max_blocks, fleet_blocks)

    def on_model(self, spec: ModelSpec) -> None:
        if spec.record == "serving":  # a version's registry record is the registry's; what serves is this one
            self.model_specs[spec.name] = spec

    def on_outcome(
        self,
        key: RequestKey,
        attempt: int,
        status: OutcomeStatus,
        error: ErrorInfo | None,
        now_ms: int,
        prompt_tokens: int = 0,
    ) -> list[Action]:
        """`prompt_tokens`: the worker's count of the prompt (its engine's tokenizer), 0 when it sent none."""
        placement = self.fleet.finish(key, attempt, now_ms)
        if placement is None:
            return []  # unknown, or a stale attempt we already placed again
        if status == OutcomeStatus.RETRYABLE and prompt_tokens > placement.request.prompt_tokens:
            # The worker's count wins over the router's estimate: if no worker can take that many,
            # retrying cannot help.
            placement.request.prompt_tokens = prompt_tokens
            if (too_long := self._too_long(placement.request)) is not None:
                return [too_long, *self._release(now_ms)]
        decision = self.recovery.on_outcome(placement, status, error)
        if status == OutcomeStatus.RETRYABLE and error is not None and _upstream_gave_up(error):
            if error.retry_after_ms:
                self.fleet.cool_down(placement.worker_id, now_ms + error.retry_after_ms)
            if not isinstance(decision, Retry) or not self._another_worker_for(decision.request, now_ms):
                # The hosted model's upstream did not answer through the worker's own retries and deployments,
                # and no other worker of the model is left to try: the next model of the route's chain takes it
                # now (the flow's fall back), else it ends with this error and its retry hint.
                return [self._final(placement.request, error), *self._release(now_ms)]
        if isinstance(decision, Retry) and decision.reason == ErrorCode.ENGINE_OOM:
            # Only where more KV is free than the failed worker had; one that reports no KV cache sets
            # no bound (its retry just goes elsewhere).
            failed = self.fleet.workers.get(placement.worker_id)
            known = failed is not None and failed.kv_blocks_total > 0
            decision.request.kv_blocks_free_over = failed.kv_blocks_free_est if failed is not None and known else None
        if isinstance(decision, Retry) and error is not None and error.retry_after_ms:
            # Upstream busy: that worker cools down as told; the request tries elsewhere after a backoff.
            self.fleet.cool_down(placement.worker_id, now_ms + error.retry_after_ms)
            decision.request.not_before_ms = now_ms + self.recovery.backoff_ms(placement.attempt)
        actions = self._follow(decision, now_ms) if isinstance(decision, Retry | GiveUp) else []
        return actions + self._release(now_ms)

    def _another_worker_for(self, request: SchedRequest, now_ms: int) -> bool:
        """A worker of the request's model that has not failed it and could take it now (ready, heard, not
        cooling down)."""
        timeout_ms = self.recovery.heartbeat_timeout_ms
        return any(
            w.serves(request.model, request.model_version)
            and w.state == WorkerState.READY
            and w.worker_id not in request.excluded_workers
            and now_ms >= w.cooldown_until_ms
            and self.fleet.heard(w, now_ms, timeout_ms)
            for w in self.fleet.workers.values()
        )

    def fits_model(self, request: SchedRequest, model: str) -> bool:
        """Whether a worker of `model` could take `request` (its window and KV); True while none is known."""
        elsewhere = replace(request, model=model, model_version=None)
        return not never_fits(elsewhere, list(self.fleet.workers.values()))

    def cancel(self, key: RequestKey) -> SchedRequest | None:
        """Drop a queued or delayed request (a placed one is cancelled by its worker)."""
        if (delayed := self.delayed.pop(key, None)) is not None:
            return delayed
        queue = self.queues.find(key)
        return queue.remove(key) if queue is not None else None

    def forget(self, key: RequestKey, attempt: int) -> Placement | None:
        """Undo a placement that was not published (another instance claimed it first, or Redis or
        Kafka failed): the request is no longer held, so a redelivery or retry of it is taken again."""
        return self.fleet.finish(key, attempt)

    def delay(self, request: SchedRequest, until_ms: int) -> None:
        """Hold a request out of the queues until `until_ms`; `tick` admits it then."""
        request.not_before_ms = until_ms
        self.delayed[request.key] = request

    def tick(self, now_ms: int) -> list[Action]:
        if self.watching_since_ms is None:
            self.watching_since_ms = now_ms
        actions: list[Action] = []
        for worker_id in self.fleet.dead_workers(now_ms, self.recovery.heartbeat_timeout_ms, self.watching_since_ms):
            actions += self._lose_worker(worker_id, now_ms)
        for request in [r for r in self.delayed.values() if r.not_before_ms <= now_ms]:
            del self.delayed[request.key]
            actions += self._admit(request, now_ms, force=True)
        for model, queue in self.queues.by_model.items():
            if len(queue) and self._nobody_serves(model, now_ms):
                for request in [r for r in queue.in_order() if _has_fallback(r)]:
                    queue.remove(request.key)
                    unavailable = ErrorInfo.of(ErrorCode.MODEL_UNAVAILABLE, f"no live worker serves {model!r}")
                    actions.append(self._final(request, unavailable))
            # Until the fleet is known, a request's wait limit cannot tell "nobody serves it" from
            # "not heard yet": only its own deadline ends it then.
            for request in queue.expire(now_ms, wait_limit=self._fleet_known(now_ms)):
                actions.append(self._final(request, self._expired_error(request, now_ms)))
        actions += self._release(now_ms)
        self.queues.prune()
        return actions

    # -- internals ------------------------------------------------------------------------
    def _state(self, now_ms: int) -> CycleState:
        return CycleState(
            now_ms,
            self.fleet,
            self.prefix_index,
            self.sessions,
            self.model_specs,
            self.rng,
            self.config.prefix_block_tokens,
            self.config.heartbeat_timeout_ms,
        )

    def _try_place(self, request: SchedRequest, now_ms: int) -> Placement | None:
        state = self._state(now_ms)
        result = self.pipeline.pick(state, request)
        if result.worker is None:
            return None
        worker_id = result.worker.worker_id
        placement = self.fleet.place(request, worker_id, now_ms, state.uncached_tokens(request, worker_id))
        self.prefix_index.record(placement.worker_id, request.prefix_block_hashes, now_ms)
        self.sessions.record(request.session_id, placement.worker_id)
        self.stats.placed += 1
        return placement

    def _admit(self, request: SchedRequest, now_ms: int, force: bool) -> list[Action]:
        if request.deadline_ms is not None and now_ms >= request.deadline_ms:
            return [self._final(request, ErrorInfo.of(ErrorCode.DEADLINE_EXCEEDED, "deadline passed before placement"))]
        if (too_long := self._too_long(request)) is not None:
            return [too_long]
        if request.kv_blocks_free_over is not None and not any(
            w.serves(request.model, request.model_version) and w.kv_blocks_total > request.kv_blocks_free_over
            for w in self.fleet.workers.values()
        ):
            free = request.kv_blocks_free_over
            more = f"no worker can have more than the {free} free KV blocks it ran out of memory with"
            return [self._final(request, ErrorInfo(code=ErrorCode.ENGINE_OOM, message=more, retryable=False))]
        if _has_fallback(request) and self._nobody_serves(request.model, now_ms, request.model_version):
            return [
                self._final(
                    request, ErrorInfo.of(ErrorCode.MODEL_UNAVAILABLE, f"no live worker serves {request.model!r}")
                )
            ]
        queue = self.queues.by_model.get(request.model)
        if queue is None or len(queue) == 0:  # nobody waiting: no one to overtake
            placement = self._try_place(request, now_ms)
            if placement is not None:
                return [PlaceAction(placement)]
        if (refused := self.queues.admit(request, force=force)) is not None:
            code = ErrorCode.RATE_LIMITED if refused.tenants_own else ErrorCode.QUEUE_FULL
            return [self._final(request, ErrorInfo.of(code, refused.reason, retry_after_ms=1000))]
        self.stats.queued += 1
        return self._release(now_ms, models=[request.model])

    def _too_long(self, request: SchedRequest) -> FinalError | None:
        if not never_fits(request, list(self.fleet.workers.values())):
            return None
        answer = "at least 1 answer token" if request.max_tokens_auto else f"max_tokens {request.max_tokens}"
        message = f"prompt {request.prompt_tokens} + {answer} tokens exceed every worker's max model length or KV cache"
        return self._final(request, ErrorInfo.of(ErrorCode.PROMPT_TOO_LONG, message))

    def _expired_error(self, request: SchedRequest, now_ms: int) -> ErrorInfo:
        """Why a queued request ends unplaced: its own deadline passed (late), or it waited the whole
        max wait while no live worker served its model (unavailable now; retryable: a worker may come,
        and is known within one heartbeat timeout of its start), or while every worker of it was full (the
        fleet's capacity: over_capacity, which the route's next model takes where there is one)."""
        own_deadline_passed = request.deadline_ms is not None and now_ms >= request.deadline_ms
        if not own_deadline_passed and self._nobody_serves(request.model, now_ms, request.model_version):
            version = f" version {request.model_version!r}" if request.model_version else ""
            return ErrorInfo.of(
                ErrorCode.MODEL_UNAVAILABLE,
                f"no live worker serves {request.model!r}{version}; waited {now_ms - request.arrived_at_ms} ms for one",
                retry_after_ms=self.recovery.heartbeat_timeout_ms,
            )
        if own_deadline_passed:
            return ErrorInfo.of(
                ErrorCode.DEADLINE_EXCEEDED, f"no worker took it before its deadline (attempt {request.attempt})"
            )
        waited_ms = now_ms - request.arrived_at_ms
        return ErrorInfo.of(ErrorCode.OVER_CAPACITY, f"no worker of {request.model!r} was free for {waited_ms} ms")

    def _fleet_known(self, now_ms: int) -> bool:
        """A heartbeat timeout after the first tick every live worker has been heard from."""
        since = self.watching_since_ms
        return since is not None and now_ms - since >= self.recovery.heartbeat_timeout_ms

    def _nobody_serves(self, model: str, now_ms: int, version: str | None = None) -> bool:
        """True once the fleet is known (a heartbeat timeout after start) and no live worker lists the model.

        Used only for requests with a fallback chain: answering now lets the next model take over.
        Requests without one wait (up to max_wait_ms) for a worker to come, e.g. one scaled up from zero.
        A DEGRADED worker (its upstream failing) serves nothing until its probe succeeds, and one cooling
        down (its upstream said 429 / 503 for a while) nothing until then, so both count as absent: with
        every hosted worker of a model degraded or busy, the fallback model answers.
        """
        if not self._fleet_known(now_ms):
            return False
        timeout_ms = self.recovery.heartbeat_timeout_ms
        return not any(
            w.serves(model, version)
            and w.state not in (WorkerState.STOPPED, WorkerState.DEGRADED)
            and now_ms >= w.cooldown_until_ms
            and self.fleet.heard(w, now_ms, timeout_ms)
            for w in self.fleet.workers.values()
        )

    def _release(self, now_ms: int, models: list[str] | None = None) -> list[Action]:
        actions: list[Action] = []
        for model in models or list(self.queues.by_model):
            queue = self.queues.by_model.get(model)
            if queue is None or not len(queue):
                continue

            def try_place(request: SchedRequest) -> bool:
                placement = self._try_place(request, now_ms)
                if placement is not None:
                    actions.append(PlaceAction(placement))
                return placement is not None

            queue.release(try_place, self.config.release_max_misses)
        return actions

    def _lose_worker(self, worker_id: str, now_ms: int) -> list[Action]:
        lost = self.fleet.remove_worker(worker_id)
        self.prefix_index.remove_worker(worker_id)
        self.sessions.remove_worker(worker_id)
        self.stats.workers_lost += 1
        actions: list[Action] = []
        for decision in self.recovery.on_worker_lost(lost):
            actions += self._follow(decision, now_ms)
        return actions

    def _follow(self, decision: Retry | GiveUp, now_ms: int) -> list[Action]:
        if isinstance(decision, GiveUp):  # after an attempt that ran: max attempts, an error no retry helps, lost
            final = self._final(decision.request, decision.error)
            final.ran = True
            final.gave_up = decision if decision.failed is not None else None
            return [final]
        self.stats.retried += 1
        if decision.request.not_before_ms > now_ms:
            self.delay(decision.request, decision.request.not_before_ms)
            return []
        return self._admit(decision.request, now_ms, force=True)

    def retry_legs(self, final: FinalError, legs: set[int], now_ms: int) -> list[Action] | None:
        """A max_attempts error about to go out (`final.gave_up`), and `legs`: the attempts whose text the answer
        so far continues. Not counted, they may leave the request an attempt: it goes on (placed, queued, or
        another final error); None: its error stands."""
        if final.gave_up is None:
            return None
        decision = self.recovery.retry_legs(final.gave_up, legs)
        if not isinstance(decision, Retry):
            return None
        code = final.error.code.value  # counted when it was decided: not an error after all
        self.stats.final_errors[code] = max(0, self.stats.final_errors.get(code, 0) - 1)
        return self._follow(decision, now_ms) + self._release(now_ms)

    def _final(self, request: SchedRequest, error: ErrorInfo) -> FinalError:
        self.stats.final_errors[error.code.value] = self.stats.final_errors.get(error.code.value, 0) + 1
        return FinalError(request, error)


def _has_fallback(request: SchedRequest) -> bool:
    return request.routed is not None and bool(request.routed.fallback_chain)


def _upstream_gave_up(error: ErrorInfo) -> bool:
    """A worker's hand-back that says its hosted upstream did not answer (after the worker's own retries):
    failing or stalling, busy past the wait the worker allows, or over its window."""
    busy = error.code == ErrorCode.OVER_CAPACITY and bool(error.retry_after_ms)
    return busy or error.code in (ErrorCode.MODEL_UNAVAILABLE, ErrorCode.PROMPT_TOO_LONG)
