"""Engine-worker handlers: a dispatch becomes a token stream, one result and one outcome.

An attempt publishes its final chunk and result only after claiming the request's final
marker (llmbus.state.fencing; how an attempt ends on the bus is services/engine_worker/adapters/ending.py): a
zombie attempt (its worker declared dead, then back) cannot add a second result. Superseded
attempts are also checked for while they run, and aborted.
Engine errors: a dead engine restarts the engine (one request's OOM does not); an upstream 4xx or a validation
error is the request's final error; a 429/503 cools this worker down and hands the request back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiokafka.structs import ConsumerRecord

from llmbus.bus import Bus, decode
from llmbus.bus.headers import TRACEPARENT, TRACESTATE, as_dict
from llmbus.bus.replies import reply_topic_of
from llmbus.contract.engine_features import missing_features, refusal
from llmbus.contract.messages import (
    Control,
    ControlAction,
    Dispatch,
    ErrorCode,
    ErrorInfo,
    FinishReason,
    InferenceResult,
    OutcomeStatus,
    ResultStatus,
    Timings,
    ToolCallDelta,
    Usage,
    now_ms,
)
from llmbus.contract.request_key import RequestKey
from llmbus.contract.tool_calls import assemble_tool_calls
from llmbus.state.fencing import RequestFence
from llmbus_services.engine_worker.adapters.ending import AttemptEnd, ResultOut
from llmbus_services.engine_worker.adapters.streaming import ChunkBatcher, ReplyStream
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.engine import (
    AdmissionError,
    Engine,
    EngineError,
    EngineOutput,
    EngineRequest,
    UpstreamBusy,
    honoured_features,
)

log = logging.getLogger(__name__)
__all__ = ["ResultOut", "RunSite", "WorkerHandlers"]


@dataclass(frozen=True)
class RunSite:
    """Where this worker's requests run, recorded in each result (`llmbus trace` shows it)."""

    node_id: str | None = None
    gpu: str | None = None
    model_version: str | None = None
    model_format: str | None = None


class WorkerHandlers:
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
        # request id → when its engine span began (the result's engine_ms counts from here): the
        # heartbeat says the oldest, so cost-accounting keeps the intervals it ran in open until it ends.
        self.engine_started_ms: dict[RequestKey, float] = {}
        self.engine_failures = 0
        self.engine_failed = asyncio.Event()  # the app restarts the engine when set
        self.site = RunSite(node_id=settings.node_id, model_version=settings.model_version)
        self.end = AttemptEnd(bus, fence, settings.worker_id)  # the final answer and the outcome
        # When this worker's process started (the app sets it from the kernel's record). A dispatch sent
        # before it went to an earlier process under this id, which may have streamed part of it before
        # it died: running it again as the same attempt would mix two texts under one attempt number.
        self.started_at_ms = now_ms()

    async def on_dispatch(self, record: ConsumerRecord) -> None:
        dispatch = decode(record, Dispatch)
        try:
            await self._handle(dispatch, record)
        except ResultOut:
            # The result is published: sending the request round again (or answering it with an
            # error) would give it a second result. The scheduler learns the end from the marker.
            log.exception("dispatch %s: result out, its bookkeeping failed", dispatch.dedupe_key)
        except Exception as exc:
            log.exception("dispatch %s failed in the worker", dispatch.dedupe_key)
            error = ErrorInfo.of(ErrorCode.WORKER_ERROR, f"{type(exc).__name__}: {exc}"[:2000])
            try:
                await self._retryable(dispatch, error)  # the scheduler places it again
            except Exception:
                # Not even the outcome went out: nobody would retry it. Answer the client (fenced, so
                # never a second result) before the record goes to the DLQ.
                await self._answer_failure(dispatch, error)
                raise

    async def _handle(self, dispatch: Dispatch, record: ConsumerRecord) -> None:
        running_attempt = self.running.get(dispatch.request_key)
        if running_attempt == dispatch.attempt:
            return  # the same attempt re-sent while it runs here (a restarted scheduler): one run only
        if running_attempt is not None:
            # A later attempt while the earlier (fenced off, aborting) one still holds the engine's
            # request id: hand it back, so it is placed again once the earlier one is gone.
            busy = ErrorInfo.of(ErrorCode.HANDED_BACK, f"attempt {running_attempt} still runs here")
            await self._retryable(dispatch, busy)
            return
        # Check and claim with no await between: a second copy handled concurrently sees the claim.
        self.running[dispatch.request_key] = dispatch.attempt
        try:
            await self._admit_and_run(dispatch, record)
        finally:
            if self.running.get(dispatch.request_key) == dispatch.attempt:
                del self.running[dispatch.request_key]

    async def _admit_and_run(self, dispatch: Dispatch, record: ConsumerRecord) -> None:
        if await self.fence.superseded(dispatch.request_key, dispatch.attempt):
            await self._outcome(dispatch, OutcomeStatus.DUPLICATE)  # finished already, or a later attempt runs
            return
        if (cooling_s := self.cooldown_until_s - time.monotonic()) > 0:
            busy = ErrorInfo.of(ErrorCode.OVER_CAPACITY, "upstream busy", retry_after_ms=round(cooling_s * 1000))
            await self._retryable(dispatch, busy)
            return
        if self.draining:
            await self._retryable(dispatch, ErrorInfo.of(ErrorCode.HANDED_BACK, "worker draining"))
            return
        if self.engine_failed.is_set():
            await self._retryable(dispatch, ErrorInfo.of(ErrorCode.ENGINE_FAILED, "engine restarting"))
            return
        if dispatch.dispatched_at_ms < self.started_at_ms:
            # Its next attempt starts afresh: readers void this attempt's chunks (or say it diverged).
            restarted = ErrorInfo.of(ErrorCode.HANDED_BACK, "dispatched to an earlier process of this worker")
            await self._retryable(dispatch, restarted)
            return
        await self._run(dispatch, as_dict(record.headers))

    async def on_control(self, record: ConsumerRecord) -> None:
        control = decode(record, Control)
        # A cancel names the request by its key (tenant and request id): one tenant cannot cancel another's.
        if control.action == ControlAction.CANCEL and control.target_id in self.running:
            await self.engine.abort(control.target_id)
        elif control.action == ControlAction.DRAIN and control.target_id == self.settings.worker_id:
            self.draining = True
            if self.on_drain is not None:
                await self.on_drain()

    async def abort_all(self) -> None:
        """Drain's last step: whatever still runs is aborted and handed back to the scheduler."""
        for key in list(self.running):
            await self.engine.abort(key)

    async def _run(self, dispatch: Dispatch, headers: dict[str, str]) -> None:
        routed = dispatch.routed
        request = routed.request
        prompt = request.prompt_text()
        if missing := missing_features(self.engine.name, request.engine_features(), honoured_features(self.engine)):
            # Final: this engine would answer something else than asked (free text for JSON, ...).
            refused = ErrorInfo.of(ErrorCode.INVALID_REQUEST, refusal(self.engine.name, routed.model, missing))
            await self._answer_failure(dispatch, refused)
            return
        prompt_tokens = self.engine.count_tokens(prompt)
        try:
            self.engine.check_admission(prompt_tokens, request.max_tokens)
        except AdmissionError as refused:
            # The count goes back with it: counted by the model's tokenizer here, it tells the scheduler
            # when no worker can take the prompt (a final prompt_too_long, not attempts until max_attempts).
            await self._outcome(
                dispatch, OutcomeStatus.RETRYABLE, ErrorInfo.of(refused.code, str(refused)), prompt_tokens
            )
            return
        reply_topic = reply_topic_of(self.bus.topics, request.reply_topic)
        batcher = ChunkBatcher(
            request.request_id,
            request.tenant,
            self.settings.chunk_interval_ms,
            self.settings.chunk_max_tokens,
            model=routed.model,
            shadow=routed.shadow,
            attempt=dispatch.attempt,
        )
        engine_request = EngineRequest(
            request_id=request.request_key,  # the engine's own id: unique per (tenant, request id) on this worker
            prompt=prompt,
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=tuple(request.stop),
            priority=request.priority,
            response_format=request.response_format.model_dump(exclude_none=True) if request.response_format else None,
            tools=request.tools,
            tool_choice=request.tool_choice,
            suffix=request.suffix,
            trace_headers={k: v for k, v in headers.items() if k in (TRACEPARENT, TRACESTATE)},
            messages=tuple(request.messages) if request.prompt is None else (),
        )
        started_ms = time.time() * 1000
        self.engine_started_ms[request.request_key] = started_ms
        try:
            await self._generate(dispatch, engine_request, reply_topic, batcher, started_ms)
        finally:
            self.engine_started_ms.pop(request.request_key, None)

    def oldest_running_started_at_ms(self) -> int | None:
        return int(min(self.engine_started_ms.values())) if self.engine_started_ms else None

    async def _generate(
        self,
        dispatch: Dispatch,
        engine_request: EngineRequest,
        reply_topic: str,
        batcher: ChunkBatcher,
        started_ms: float,
    ) -> None:
        request = dispatch.routed.request
        first_token_ms: float | None = None
        text: list[str] = []
        tool_calls: list[ToolCallDelta] = []
        last: EngineOutput | None = None
        stream = ReplyStream(self.bus.publisher, reply_topic, request.request_id, self.bus.settings.publish_retry_s)
        superseded = False
        next_check_s = time.monotonic() + self.settings.superseded_check_s
        try:
            async for out in self.engine.generate(engine_request):
                last = out
                if out.new_tokens and first_token_ms is None:
                    first_token_ms = time.time() * 1000
                text.append(out.delta)
                if out.tool_calls:
                    tool_calls += out.tool_calls
                if (chunk := batcher.add(out.delta, out.new_tokens, out.tool_calls)) is not None:
                    await stream.send(chunk)
                if not superseded and time.monotonic() >= next_check_s:
                    next_check_s = time.monotonic() + self.settings.superseded_check_s
                    if superseded := await self._still_superseded(dispatch):
                        await self.engine.abort(request.request_key)  # the stream ends with "abort"
        except EngineError as failed:
            await self._engine_failed(dispatch, failed, reply_topic, batcher.last_seq)
            return
        if superseded:
            log.warning("%s: superseded while running, aborted", dispatch.dedupe_key)
            await self._outcome(dispatch, OutcomeStatus.DUPLICATE)
            return
        if last is not None and last.finish_reason == "abort" and self.draining:
            await self._retryable(dispatch, ErrorInfo.of(ErrorCode.HANDED_BACK, "worker drained before it finished"))
            return
        if (chunk := batcher.flush()) is not None:
            await stream.send(chunk)
        result = self._result(dispatch, "".join(text), last, started_ms, first_token_ms)
        if tool_calls:
            result.tool_calls = assemble_tool_calls(tool_calls)
        await self.end.publish_final(dispatch, result, reply_topic, batcher.last_seq, OutcomeStatus.COMPLETED, stream)

    async def _answer_failure(self, dispatch: Dispatch, error: ErrorInfo) -> None:
        final = error.model_copy(update={"retryable": False})
        reply_topic = reply_topic_of(self.bus.topics, dispatch.routed.request.reply_topic)
        await self.end.publish_final(
            dispatch, self._error_result(dispatch, final), reply_topic, -1, OutcomeStatus.FAILED
        )

    def _error_result(self, dispatch: Dispatch, error: ErrorInfo) -> InferenceResult:
        routed = dispatch.routed
        return InferenceResult(
            request_id=routed.request_id,
            tenant=routed.request.tenant,
            status=ResultStatus.ERROR,
            error=error,
            finish_reason=FinishReason.ERROR,
            model=routed.model,
            worker_id=self.settings.worker_id,
            shadow=routed.shadow,
            experiment_id=routed.experiment_id,
            variant=routed.variant,
            attempt=dispatch.attempt,
            produced_by=self.bus.service,
            **routed.facts(),
        )

    async def _still_superseded(self, dispatch: Dispatch) -> bool:
        try:
            return await self.fence.superseded(dispatch.request_key, dispatch.attempt)
        except Exception:  # Redis away: keep generating; the claim at the end decides
            log.warning("superseded check failed for %s", dispatch.dedupe_key, exc_info=True)
            return False

    async def _engine_failed(self, dispatch: Dispatch, failed: EngineError, reply_topic: str, last_seq: int) -> None:
        """One request's engine error: restart only a dead engine, end a wrong request, cool down when busy."""
        error = ErrorInfo.of(failed.code, str(failed))
        if failed.restarts_engine:
            self._note_engine_failure(failed)
        if not failed.retryable:
            final = ErrorInfo(code=failed.code, message=str(failed)[:2000], retryable=False)
            result = self._error_result(dispatch, final)
            await self.end.publish_final(dispatch, result, reply_topic, last_seq, OutcomeStatus.FAILED)
            return
        if isinstance(failed, UpstreamBusy):
            self.cooldown_until_s = max(self.cooldown_until_s, time.monotonic() + failed.retry_after_s)
            error = ErrorInfo.of(failed.code, str(failed), retry_after_ms=round(failed.retry_after_s * 1000))
        await self._retryable(dispatch, error)

    def _result(
        self, dispatch: Dispatch, text: str, last: EngineOutput | None, started_ms: float, first_token_ms: float | None
    ) -> InferenceResult:
        routed = dispatch.routed
        done_ms = time.time() * 1000
        received = routed.received_at_ms
        completion = last.completion_tokens if last else 0
        aborted = last is not None and last.finish_reason == "abort"
        timings = Timings(
            received_at_ms=received,
            queued_ms=round(started_ms - received, 3),
            ttft_ms=round(first_token_ms - received, 3) if first_token_ms else None,
            total_ms=round(done_ms - received, 3),
            engine_ms=round(done_ms - started_ms, 3),
            tpot_ms=round((done_ms - first_token_ms) / (completion - 1), 3)
            if first_token_ms and completion > 1
            else None,
        )
        return InferenceResult(
            request_id=routed.request_id,
            tenant=routed.request.tenant,
            status=ResultStatus.ERROR if aborted else ResultStatus.OK,
            error=ErrorInfo.of(ErrorCode.CANCELLED, "cancelled by the client") if aborted else None,
            model=routed.model,
            worker_id=self.settings.worker_id,
            text=text,
            finish_reason=FinishReason(last.finish_reason) if last and last.finish_reason else FinishReason.STOP,
            usage=Usage(
                prompt_tokens=last.prompt_tokens if last else 0,
                completion_tokens=completion,
                cached_prompt_tokens=last.cached_prompt_tokens if last else 0,
            ),
            timings=timings,
            shadow=routed.shadow,
            experiment_id=routed.experiment_id,
            variant=routed.variant,
            trimmed_tokens=routed.trimmed_tokens,
            max_tokens_requested=routed.max_tokens_requested,
            attempt=dispatch.attempt,
            produced_by=self.bus.service,
            completed_at_ms=now_ms(),
            node_id=self.site.node_id,
            gpu=self.site.gpu,
            model_version=self.site.model_version,
            model_format=self.site.model_format,
            preemptions=last.preemptions if last else 0,
            **routed.facts(),
        )

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
