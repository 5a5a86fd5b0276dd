"""The dispatch flow: a dispatch becomes a token stream, one result and one outcome.

An attempt publishes its final chunk and result only after claiming the request's final
marker (llmbus.state.fencing; how an attempt ends on the bus is services/engine_worker/adapters/ending.py): a
zombie attempt (its worker declared dead, then back) cannot add a second result. Superseded
attempts are also checked for while they run, and aborted.
A later attempt of an answer cut mid-stream continues it (docs/delivery.md, "Continuation across legs"):
the answer so far is read back from the reply topic and the engine generates what follows it.
Engine errors: a dead engine restarts the engine (one request's OOM does not); an upstream 4xx or a validation
error is the request's final error; a 429/503 cools this worker down and hands the request back.
"""

from __future__ import annotations

import logging
import time

from aiokafka.structs import ConsumerRecord

from llmbus.bus import Bus, decode
from llmbus.bus.headers import TRACEPARENT, TRACESTATE, as_dict
from llmbus.bus.replies import reply_topic_of
from llmbus.contract.engine_features import missing_features, refusal
from llmbus.contract.messages import (
    Continuation,
    ContinuedFrom,
    Dispatch,
    ErrorCode,
    ErrorInfo,
    OutcomeStatus,
    TokenChunk,
    now_ms,
)
from llmbus.state.fencing import RequestFence
from llmbus_services.engine_worker.adapters import metrics
from llmbus_services.engine_worker.adapters.continuation_read import read_back
from llmbus_services.engine_worker.adapters.ending import ResultOut
from llmbus_services.engine_worker.adapters.streaming import ChunkBatcher
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.continuation import can_continue, continuable, remaining_tokens
from llmbus_services.engine_worker.core.engine import (
    AdmissionError,
    Engine,
    EngineRequest,
    adapter_refusal,
    answer_room,
    honoured_features,
)
from llmbus_services.engine_worker.core.legs import continuation_from
from llmbus_services.engine_worker.core.request import engine_request as engine_request_of
from llmbus_services.engine_worker.core.result import RunSite
from llmbus_services.engine_worker.flows.answer import AnswerFlow

log = logging.getLogger(__name__)
__all__ = ["DispatchFlow", "ResultOut", "RunSite"]


class DispatchFlow(AnswerFlow):
    def __init__(self, bus: Bus, settings: WorkerSettings, engine: Engine, fence: RequestFence) -> None:
        super().__init__(bus, settings, engine, fence)
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
            # The earlier process is lost (its attempt with it): the next attempt continues what it streamed.
            restarted = ErrorInfo.of(ErrorCode.WORKER_LOST, "dispatched to an earlier process of this worker")
            await self._retryable(dispatch, restarted)
            return
        await self._run(dispatch, as_dict(record.headers))

    async def _run(self, dispatch: Dispatch, headers: dict[str, str]) -> None:
        routed = dispatch.routed
        request = routed.request
        if missing := missing_features(self.engine.name, request.engine_features(), honoured_features(self.engine)):
            # Final: this engine would answer something else than asked (free text for JSON, ...).
            refused = refusal(self.engine.name, routed.model, missing)
            await self._answer_failure(dispatch, ErrorInfo.of(ErrorCode.INVALID_REQUEST, refused, param=missing[0]))
            return
        if (no_adapter := adapter_refusal(self.engine, routed.adapter)) is not None:
            await self._answer_failure(dispatch, ErrorInfo.of(ErrorCode.INVALID_REQUEST, no_adapter))
            return
        trace_headers = {k: v for k, v in headers.items() if k in (TRACEPARENT, TRACESTATE)}
        engine_request = engine_request_of(dispatch, trace_headers)
        # Counted as the router counts (the turns and the tool definitions), with the engine's tokenizer.
        count, tokenizer = self.engine.count_tokens, routed.prompt_tokenizer
        prompt_tokens = count(engine_request.prompt, tokenizer)
        if request.tools:
            prompt_tokens += count(request.tools_text(), tokenizer)
        reply_topic = reply_topic_of(self.bus.topics, request.reply_topic)
        continuation: Continuation | None = None
        if dispatch.attempt > 1:
            continuation, ended = await self._answer_so_far(dispatch, engine_request, reply_topic, prompt_tokens)
            if continuation is not None and ended is not None:
                await self._answer_ended(dispatch, continuation, ended)
                return
            if continuation is not None and len(continuation.legs) >= self._migration_limit(dispatch):
                await self._over_migration_limit(
                    dispatch, continuation, reply_topic, self._batcher(dispatch, continuation)
                )
                return
        batcher = self._batcher(dispatch, continuation)
        if continuation is not None and remaining_tokens(engine_request, continuation) <= 0:
            await self._answer_now(dispatch, continuation, reply_topic, batcher)
            return
        # The engine reads the answer so far as prompt. An unset max_tokens is bounded by what this engine's
        # window leaves; the engine bounds it again by its own count of what the model reads.
        read_tokens = prompt_tokens + (continuation.completion_tokens if continuation is not None else 0)
        asked = engine_request.max_tokens - (continuation.completion_tokens if continuation is not None else 0)
        auto, window = engine_request.max_tokens_auto, self.engine.max_model_len
        max_tokens = answer_room(read_tokens, asked, auto, window)
        try:
            self.engine.check_admission(read_tokens, max_tokens)
        except AdmissionError as refused:
            # The count goes back with it: counted by the model's tokenizer here, it tells the scheduler
            # when no worker can take the prompt (a final prompt_too_long, not attempts until max_attempts).
            await self._outcome(
                dispatch, OutcomeStatus.RETRYABLE, ErrorInfo.of(refused.code, str(refused)), prompt_tokens
            )
            return
        if continuation is not None:
            metrics.CONTINUATIONS.labels(continuation.ended.value).inc()
            log.info(
                "%s: continues attempt %d at seq %d (%d tokens, %d legs; %s)",
                dispatch.dedupe_key,
                continuation.continues_attempt,
                continuation.next_seq,
                continuation.completion_tokens,
                len(continuation.legs),
                continuation.ended.value,
            )
        started_ms = time.time() * 1000
        key = request.request_key
        self.engine_started_ms[key] = started_ms
        if can_continue(self.engine, engine_request):
            self.continuable.add(key)
        try:
            await self._generate(dispatch, engine_request, reply_topic, batcher, started_ms, continuation)
        finally:
            self.engine_started_ms.pop(key, None)
            self.continuable.discard(key)

    def _batcher(self, dispatch: Dispatch, continuation: Continuation | None = None) -> ChunkBatcher:
        routed = dispatch.routed
        continues = None
        if continuation is not None:
            continues = ContinuedFrom(attempt=continuation.continues_attempt, seq=continuation.next_seq)
        return ChunkBatcher(
            routed.request_id,
            routed.request.tenant,
            self.settings.chunk_interval_ms,
            self.settings.chunk_max_tokens,
            model=routed.model,
            shadow=routed.shadow,
            attempt=dispatch.attempt,
            continues=continues,
        )

    async def _answer_so_far(
        self, dispatch: Dispatch, request: EngineRequest, reply_topic: str, prompt_tokens: int
    ) -> tuple[Continuation | None, TokenChunk | None]:
        """What this attempt continues: the answer earlier attempts streamed, read back from the reply topic,
        and the final chunk that already ended it if one did. None: nothing to continue (no text was streamed),
        or an answer this attempt starts again."""
        if continuable(request) is not None or not can_continue(self.engine, request):
            return None, None  # started again, as the chunk contract's restart rule says
        settings = self.settings
        try:
            found = await read_back(
                self.bus, reply_topic, dispatch, settings.continuation_margin_ms, settings.continuation_read_timeout_s
            )
        except Exception:  # a guess could repeat or lose text: start the answer again instead
            log.warning(
                "%s: the answer so far could not be read back; starting again", dispatch.dedupe_key, exc_info=True
            )
            metrics.CONTINUATIONS_REFUSED.labels("read_failed").inc()
            return None, None
        so_far = found.so_far
        if so_far is None:
            return None, None
        if so_far.problem is not None:
            log.warning("%s: not continued (%s); starting again", dispatch.dedupe_key, so_far.problem)
            metrics.CONTINUATIONS_REFUSED.labels("not_continuable").inc()
            return None, None
        return continuation_from(so_far, dispatch.earlier, found.written_ms, prompt_tokens), so_far.final

    def oldest_running_started_at_ms(self) -> int | None:
        return int(min(self.engine_started_ms.values())) if self.engine_started_ms else None
