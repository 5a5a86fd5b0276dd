"""An admitted attempt's answer: the engine's stream to chunks, its legs, and how the attempt ends.

The base of the worker's flows (dispatch.py admits a dispatch, then runs `_generate`). An answer is
one leg per engine run (docs/delivery.md, "Continuation across legs"): an engine that ends a leg with
LegCut(in_process=True) is called again at once with the answer so far; any other cut mid-answer
(an engine or upstream failure, a drain) hands the request back only once every chunk it streamed is
acknowledged, so the next worker reads back exactly what the client was sent and continues from it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from llmbus.bus import Bus
from llmbus.bus.replies import reply_topic_of
from llmbus.contract.messages import (
    Continuation,
    Dispatch,
    ErrorCode,
    ErrorInfo,
    FinishReason,
    Leg,
    LegEnd,
    OutcomeStatus,
    ResultStatus,
    TokenChunk,
    Usage,
    now_ms,
)
from llmbus.contract.request_key import RequestKey
from llmbus.state.fencing import RequestFence
from llmbus_services.engine_worker.adapters import metrics
from llmbus_services.engine_worker.adapters.ending import AttemptEnd
from llmbus_services.engine_worker.adapters.streaming import ChunkBatcher, ReplyStream
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.answer import Answer
from llmbus_services.engine_worker.core.continuation import continued
from llmbus_services.engine_worker.core.engine import (
    AdmissionError,
    Engine,
    EngineError,
    EngineRequest,
    LegCut,
    RequestRejected,
    UpstreamBusy,
    UpstreamFailed,
)
from llmbus_services.engine_worker.core.legs import LegRun, answer_usage
from llmbus_services.engine_worker.core.result import RunSite, answer_result, error_result

log = logging.getLogger(__name__)


class AnswerFlow:
    def __init__(self, bus: Bus, settings: WorkerSettings, engine: Engine, fence: RequestFence) -> None:
        self.bus = bus
        self.settings = settings
        self.engine = engine
        self.fence = fence
        self.cooldown_until_s = 0.0  # monotonic: upstream said 429/503, take nothing new until then
        self.draining = False
        # Called when Control(drain) arrives: the lifecycle heartbeats DRAINING at once, so the
        # scheduler stops placing here (each refused dispatch would burn one of the request's attempts).
        self.on_drain: Callable[[], Awaitable[None]] | None = None
        self.running: dict[RequestKey, int] = {}  # request → attempt handled here now (claimed before any await)
        # Requests running here whose answer can be continued elsewhere: a drain hands them over first.
        self.continuable: set[RequestKey] = set()
        # request id → when its engine span began (the result's engine_ms counts from here): the
        # heartbeat says the oldest, so cost-accounting keeps the intervals it ran in open until it ends.
        self.engine_started_ms: dict[RequestKey, float] = {}
        self.engine_failures = 0
        self.engine_failed = asyncio.Event()  # the app restarts the engine when set
        self.site = RunSite(
            worker_id=settings.worker_id,
            produced_by=bus.service,
            node_id=settings.node_id,
            model_version=settings.model_version,
        )
        self.end = AttemptEnd(bus, fence, settings.worker_id)  # the final answer and the outcome

    async def _generate(
        self,
        dispatch: Dispatch,
        request: EngineRequest,
        reply_topic: str,
        batcher: ChunkBatcher,
        started_ms: float,
        continuation: Continuation | None,
    ) -> None:
        """Run the engine to the attempt's end: one leg per engine run, each leg's chunks streamed."""
        key = dispatch.request_key
        answer = Answer()
        stream = ReplyStream(self.bus.publisher, reply_topic, dispatch.request_id, self.bus.settings.publish_retry_s)
        legs: list[Leg] = list(continuation.legs) if continuation is not None else []
        run = self._leg_run(dispatch, batcher, started_ms)
        engine_request = continued(request, continuation) if continuation is not None else request
        superseded = False
        next_check_s = time.monotonic() + self.settings.superseded_check_s
        while True:
            try:
                async for out in self.engine.generate(engine_request):
                    at_ms = time.time() * 1000
                    answer.add(out, at_ms)
                    run.add(out, at_ms)
                    if (chunk := batcher.add_output(out)) is not None:
                        await stream.send(chunk)
                    if not superseded and time.monotonic() >= next_check_s:
                        next_check_s = time.monotonic() + self.settings.superseded_check_s
                        if superseded := await self._still_superseded(dispatch):
                            await self.engine.abort(key)  # the stream ends with "abort"
            except LegCut as cut:
                # The leg before the cut is whole on the reply topic (flushed), and recorded.
                if (chunk := batcher.flush()) is not None:
                    await stream.send(chunk)
                legs.append(run.leg(cut.ended, now_ms()))
                if not cut.in_process or self.draining:
                    await self._handed_back(dispatch, cut, stream)
                    return
                so_far = self._own_continuation(continuation, answer, batcher, legs)
                if len(so_far.legs) >= self._migration_limit(dispatch):
                    await self._over_migration_limit(dispatch, so_far, reply_topic, batcher, stream)
                    return
                log.info("%s: %s; continued in process after %d legs", dispatch.dedupe_key, cut, len(legs))
                metrics.CONTINUATIONS.labels(cut.ended.value).inc()
                engine_request = continued(request, so_far)
                run = self._leg_run(dispatch, batcher, time.time() * 1000)
                continue
            except EngineError as failed:
                if answer.first_token_ms is not None and failed.retryable:
                    if (chunk := batcher.flush()) is not None:
                        await stream.send(chunk)
                    await stream.delivered()  # the next leg reads back all of it
                await self._engine_failed(dispatch, failed, reply_topic, batcher.last_seq)
                return
            break
        if superseded:
            log.warning("%s: superseded while running, aborted", dispatch.dedupe_key)
            await self._outcome(dispatch, OutcomeStatus.DUPLICATE)
            return
        if answer.aborted and self.draining:
            if (chunk := batcher.flush()) is not None:
                await stream.send(chunk)
            await stream.delivered()  # handed over mid-stream: the next leg reads back all of it
            await self._retryable(dispatch, ErrorInfo.of(ErrorCode.HANDED_BACK, "worker drained before it finished"))
            return
        if (chunk := batcher.flush()) is not None:
            await stream.send(chunk)
        if len(legs) > 0:
            legs.append(run.leg(LegEnd.COMPLETED, now_ms()))
        result = answer_result(dispatch, answer, started_ms, self.site, continuation, legs)
        await self.end.publish_final(
            dispatch, result, reply_topic, batcher.last_seq, OutcomeStatus.COMPLETED, stream, batcher.continues
        )

    def _leg_run(self, dispatch: Dispatch, batcher: ChunkBatcher, started_ms: float) -> LegRun:
        return LegRun(dispatch.attempt, self.settings.worker_id, dispatch.routed.model, batcher.next_seq, started_ms)

    def _own_continuation(
        self, before: Continuation | None, answer: Answer, batcher: ChunkBatcher, legs: list[Leg]
    ) -> Continuation:
        """The answer so far, as this attempt streamed it: what the next leg in this process continues."""
        first = answer.first
        prefix = before.text if before is not None else ""
        prefix_logprobs = (before.logprobs or []) if before is not None else []
        return Continuation(
            text=prefix + "".join(first.text),
            logprobs=[*prefix_logprobs, *first.logprobs] or None,
            completion_tokens=sum(leg.completion_tokens for leg in legs),
            next_seq=batcher.next_seq,
            continues_attempt=batcher.attempt,
            legs=list(legs),
        )

    def _migration_limit(self, dispatch: Dispatch) -> int:
        return dispatch.routed.request.migration_limit or self.settings.migration_limit

    async def _over_migration_limit(
        self,
        dispatch: Dispatch,
        so_far: Continuation,
        reply_topic: str,
        batcher: ChunkBatcher | None = None,
        stream: ReplyStream | None = None,
    ) -> None:
        """The cut that would start one leg more than the request allows: its final error, with the text so far
        (the client has it) and its legs. The final chunk goes on from the answer's last seq."""
        limit = self._migration_limit(dispatch)
        metrics.CONTINUATIONS_REFUSED.labels("migration_limit").inc()
        message = f"the answer was cut {len(so_far.legs)} times; its migration_limit allows {limit} legs"
        result = error_result(dispatch, ErrorInfo(code=ErrorCode.MIGRATION_LIMIT, message=message), self.site)
        result.text, result.legs, result.logprobs = so_far.text, so_far.legs, so_far.logprobs
        result.usage = _usage_of(so_far.legs)
        last_seq = so_far.next_seq - 1
        continues = batcher.continues if batcher is not None else None
        await self.end.publish_final(dispatch, result, reply_topic, last_seq, OutcomeStatus.FAILED, stream, continues)

    async def _handed_back(self, dispatch: Dispatch, cut: LegCut, stream: ReplyStream) -> None:
        """A leg cut mid-answer that this process does not continue: every chunk acknowledged, then the
        request goes back to the scheduler and its next worker continues it from the reply topic (another
        worker of the model, or the route's next model where the cut says the model's upstream failed)."""
        await stream.delivered()
        await self._retryable(dispatch, ErrorInfo(code=cut.code, message=str(cut)[:2000], retryable=True))

    async def _answer_failure(self, dispatch: Dispatch, error: ErrorInfo) -> None:
        final = error.model_copy(update={"retryable": False})
        reply_topic = reply_topic_of(self.bus.topics, dispatch.routed.request.reply_topic)
        result = error_result(dispatch, final, self.site)
        await self.end.publish_final(dispatch, result, reply_topic, -1, OutcomeStatus.FAILED)

    async def _answer_now(
        self, dispatch: Dispatch, continuation: Continuation, reply_topic: str, batcher: ChunkBatcher
    ) -> None:
        """A continued answer with no max_tokens left (cut after its last token, before its final chunk):
        it ends here at its length, with nothing more from the engine."""
        result = answer_result(dispatch, Answer(), time.time() * 1000, self.site, continuation, continuation.legs)
        result.finish_reason, result.legs, result.usage = (
            FinishReason.LENGTH,
            continuation.legs,
            _usage_of(continuation.legs),
        )
        await self.end.publish_final(
            dispatch, result, reply_topic, batcher.last_seq, OutcomeStatus.COMPLETED, None, batcher.continues
        )

    async def _answer_ended(self, dispatch: Dispatch, so_far: Continuation, final: TokenChunk) -> None:
        """An earlier attempt's final chunk ended the stream and its result never came (its worker died between
        the two): its client has that answer, whole, so that answer is the result. Nothing is generated and no
        chunk sent; the result is the ending attempt's (its text, finish reason, usage and legs)."""
        legs = list(so_far.legs)
        if legs:
            legs[-1] = legs[-1].model_copy(update={"ended": LegEnd.COMPLETED})
        result = answer_result(dispatch, Answer(), time.time() * 1000, self.site, so_far, legs)
        result.legs, result.attempt, result.finish_reason = legs or None, final.attempt, final.finish_reason
        result.usage = final.usage or _usage_of(legs)
        result.worker_id = (legs[-1].worker_id if legs else None) or result.worker_id
        if final.error is not None:
            result.status, result.error, result.finish_reason = ResultStatus.ERROR, final.error, FinishReason.ERROR
        log.warning(
            "%s: attempt %d's answer ended without its result; its result goes out", dispatch.dedupe_key, final.attempt
        )
        reply_topic = reply_topic_of(self.bus.topics, dispatch.routed.request.reply_topic)
        await self.end.publish_final(dispatch, result, reply_topic, -1, OutcomeStatus.COMPLETED, final_out=True)

    async def _still_superseded(self, dispatch: Dispatch) -> bool:
        try:
            return await self.fence.superseded(dispatch.request_key, dispatch.attempt)
        except Exception:  # Redis away: keep generating; the claim at the end decides
            log.warning("superseded check failed for %s", dispatch.dedupe_key, exc_info=True)
            return False

    async def _engine_failed(self, dispatch: Dispatch, failed: EngineError, reply_topic: str, last_seq: int) -> None:
        """One request's engine error: restart only a dead engine, end a wrong request, cool down when busy;
        an admission refusal from inside the engine (a chat template and tools over the window) goes back
        with the engine's count, so the scheduler ends it prompt_too_long where no worker can take it."""
        error = ErrorInfo.of(failed.code, str(failed))
        if failed.restarts_engine:
            self._note_engine_failure(failed)
        if isinstance(failed, UpstreamFailed):
            await self._upstream_failed(dispatch, failed)
            return
        if not failed.retryable:
            param = failed.param if isinstance(failed, RequestRejected) else None
            final = ErrorInfo(code=failed.code, message=str(failed)[:2000], retryable=False, param=param)
            result = error_result(dispatch, final, self.site)
            await self.end.publish_final(dispatch, result, reply_topic, last_seq, OutcomeStatus.FAILED)
            return
        prompt_tokens = failed.prompt_tokens if isinstance(failed, AdmissionError) else 0
        await self._outcome(dispatch, OutcomeStatus.RETRYABLE, error, prompt_tokens)

    async def _upstream_failed(self, dispatch: Dispatch, failed: UpstreamFailed) -> None:
        """A hosted upstream that did not answer goes back to the scheduler with why: it tries another worker
        of the model, else the route's next model (the one whose window fits, for a prompt too long), else
        ends the request with this error and its retry hint. Busy: this worker takes nothing for that long."""
        retry_after_ms = None if failed.retry_after_s is None else round(failed.retry_after_s * 1000)
        if isinstance(failed, UpstreamBusy):
            self.cooldown_until_s = max(self.cooldown_until_s, time.monotonic() + failed.retry_after_s)
        error = ErrorInfo(code=failed.code, message=str(failed)[:2000], retryable=True, retry_after_ms=retry_after_ms)
        await self._outcome(dispatch, OutcomeStatus.RETRYABLE, error, failed.prompt_tokens)

    def _note_engine_failure(self, failed: EngineError) -> None:
        log.error("engine failed: %s", failed)
        self.engine_failures += 1
        self.engine_failed.set()

    async def _retryable(self, dispatch: Dispatch, error: ErrorInfo) -> None:
        await self._outcome(dispatch, OutcomeStatus.RETRYABLE, error=error)

    async def _outcome(
        self, dispatch: Dispatch, status: OutcomeStatus, error: ErrorInfo | None = None, prompt_tokens: int = 0
    ) -> None:
        await self.end.outcome(dispatch, status, error=error, prompt_tokens=prompt_tokens)


def _usage_of(legs: list[Leg]) -> Usage:
    prompt, cached, completion = answer_usage(legs)
    return Usage(prompt_tokens=prompt, cached_prompt_tokens=cached, completion_tokens=completion)
