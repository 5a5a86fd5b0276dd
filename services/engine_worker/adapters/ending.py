"""How an attempt ends on the bus: at most one final answer (its final marker claimed first) and one outcome.

A completed attempt waits for three round trips in series:

1. the final marker's claim (Redis), while the acks of the last content chunks, sent without
   waiting, come back (usually all in by the time the claim is);
2. the final chunk and the result, enqueued together: one produce request;
3. the outcome, with the marker's `done` set beside it (Kafka and Redis at once).

It used to be five: content acks, claim, result, final chunk, outcome. What did not change:
the claim is taken before any final record is written; every content chunk is acknowledged, or
all are sent again in order, before the final chunk is sent; the result decides success (a
result that may or may not be out is never followed by another answer, nor handed back); the
outcome and the `done` marker follow the result; each of them rides out a broker restart.

Why the final chunk waits for the content's acks instead of being enqueued with the last of
them: records of one key stay in order only within one producer, and the Publisher replaces its
producer when the broker refuses the old one's sequence (after an outage). A content chunk still
pending in the replaced producer could then land after a final chunk sent on the new one, and a
reader, done at the final chunk, would never show it. The wait overlaps the claim's round trip,
so it rarely costs one of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time

from llmbus.bus import Bus, PublishTimeout
from llmbus.bus.replies import publish_result, publish_result_with_final, result_out_since
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    ContinuedFrom,
    Dispatch,
    DispatchOutcome,
    ErrorInfo,
    InferenceResult,
    OutcomeStatus,
    Timings,
    now_ms,
)
from llmbus.state.fencing import RequestFence, claim_kept
from llmbus_services.engine_worker.adapters.streaming import ReplyStream

log = logging.getLogger(__name__)


class ResultOut(Exception):
    """Raised when what follows a published result (final marker, outcome) failed: never retried."""


class AttemptEnd:
    def __init__(self, bus: Bus, fence: RequestFence, worker_id: str) -> None:
        self.bus = bus
        self.fence = fence
        self.worker_id = worker_id

    async def publish_final(
        self,
        dispatch: Dispatch,
        result: InferenceResult,
        reply_topic: str,
        last_seq: int,
        status: OutcomeStatus,
        stream: ReplyStream | None = None,
        continues: ContinuedFrom | None = None,
        final_out: bool = False,
    ) -> None:
        """Claim the final marker, then publish the final chunk and the result; a refused claim publishes nothing.

        `stream`: the content chunks, acknowledged (or sent again) before the final chunk; None for
        an error answer, which has no text to complete. `continues`: the attempt's marker (it continues
        an earlier attempt's answer), carried by its final chunk too. `final_out`: the final chunk is on the
        reply topic already (an earlier attempt's, whose result never came): the result alone goes out.
        """
        # The claim is taken while the last content chunks are still in flight: it gates only the
        # final records (a superseded attempt's chunks are dropped by readers on their attempt).
        claim = await self.fence.claim_first(dispatch.request_key, dispatch.attempt, now_ms())
        if not claim.claimed:
            log.warning("%s: another attempt owns the result; this one publishes none", dispatch.dedupe_key)
            await self.outcome(dispatch, OutcomeStatus.DUPLICATE)
            return
        out = await self._result_already_out(dispatch, claim.earlier_claim_ms) if claim.after_earlier else None
        if out is not None:  # attempt 0 too: the router's own answer
            # The earlier claimant died (or stalled past its lease) after its result was written and
            # before it marked it done: that result is the answer, this one is not sent.
            log.warning("%s: attempt %d's result is already out; this one publishes none", dispatch.dedupe_key, out)
            await self.fence.final_published(dispatch.request_key, out)
            await self.outcome(dispatch, OutcomeStatus.DUPLICATE)
            return
        retry_for_s = self.bus.settings.publish_retry_s
        async with claim_kept(self.fence, dispatch.request_key, dispatch.attempt):
            if stream is not None:
                # Nothing final is out yet: if the chunks cannot be delivered, the request is handed
                # back (the scheduler places it again once this claim's lease has lapsed).
                await stream.delivered()
            try:
                if final_out:
                    await publish_result(self.bus.publisher, self.bus.topics, result, None, retry_for_s=retry_for_s)
                else:
                    await publish_result_with_final(
                        self.bus.publisher,
                        self.bus.topics,
                        result,
                        reply_topic,
                        last_seq,
                        retry_for_s=retry_for_s,
                        continues=continues,
                    )
            except PublishTimeout as exc:
                # Retried through a broker outage and still unacknowledged: it may yet be written, so
                # neither a retry elsewhere nor an error result may follow (either would be a second one).
                raise ResultOut(dispatch.dedupe_key) from exc
        try:
            await self._outcome_beside_marker(dispatch, status, result)
        except Exception as exc:
            raise ResultOut(dispatch.dedupe_key) from exc

    async def _result_already_out(self, dispatch: Dispatch, earlier_claim_ms: int | None) -> int | None:
        """The attempt whose result is out since the earlier claim (its time unknown: since this
        attempt's dispatch), None if none. Raises when llm.results cannot be read: the request then
        goes round again rather than risk a second result."""
        since_ms = earlier_claim_ms if earlier_claim_ms is not None else dispatch.dispatched_at_ms
        bus = self.bus
        return await result_out_since(bus.settings, bus.topics, dispatch.request_key, since_ms, service=bus.service)

    async def outcome(
        self,
        dispatch: Dispatch,
        status: OutcomeStatus,
        error: ErrorInfo | None = None,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        # Retried through a broker restart (a copy is harmless: the scheduler acts on an attempt once);
        # failing fast would turn a hand-back into the request's final error.
        await self.bus.publisher.publish(
            self.bus.topics.name(t.OUTCOMES),
            self._outcome_of(dispatch, status, error, prompt_tokens, completion_tokens),
            key=dispatch.request_id,
            tenant=dispatch.routed.request.tenant,
            retry_for_s=self.bus.settings.publish_retry_s,
        )

    async def _outcome_beside_marker(self, dispatch: Dispatch, status: OutcomeStatus, result: InferenceResult) -> None:
        """The outcome enqueued, the `done` marker set while it travels, then its ack waited for: the
        two round trips at once, without a task for either."""
        publisher = self.bus.publisher
        topic = self.bus.topics.name(t.OUTCOMES)
        error = result.error if status == OutcomeStatus.FAILED else None
        usage = result.usage
        # The latency the result reports travels with the outcome: the scheduler's pool statistics (TTFT
        # quantiles, the autoscaler's latency trigger) are made of it.
        outcome = self._outcome_of(
            dispatch, status, error, usage.prompt_tokens, usage.completion_tokens, result.timings
        )
        tenant = dispatch.routed.request.tenant
        retry_for_s = self.bus.settings.publish_retry_s
        sent: list[asyncio.Future[object]] = []
        try:
            sent.append(await publisher.publish(topic, outcome, key=dispatch.request_id, tenant=tenant, wait=False))
        except Exception:
            log.warning("%s: outcome not enqueued; publishing it with retries", dispatch.dedupe_key, exc_info=True)
        acked = False
        try:
            await self._mark_published(dispatch)
        finally:  # the outcome goes out even if the marker could not be set
            if sent:
                try:
                    await publisher.delivered(sent, retry_for_s=retry_for_s)
                    acked = True
                except Exception:
                    log.warning("%s: outcome not acknowledged; sending it again", dispatch.dedupe_key, exc_info=True)
            if not acked:
                await publisher.publish(topic, outcome, key=dispatch.request_id, tenant=tenant, retry_for_s=retry_for_s)

    async def _mark_published(self, dispatch: Dispatch) -> None:
        """`done:<attempt>`, retried within the claim's lease: while only the pending claim stands,
        its expiry would let a later attempt publish a second result."""
        deadline_s = time.monotonic() + self.fence.claim_lease_ms / 1000
        while True:
            try:
                await self.fence.final_published(dispatch.request_key, dispatch.attempt)
                return
            except Exception:
                if time.monotonic() >= deadline_s:
                    raise
                log.warning("%s: final marker not set yet; retrying", dispatch.dedupe_key, exc_info=True)
                await asyncio.sleep(0.5)

    def _outcome_of(
        self,
        dispatch: Dispatch,
        status: OutcomeStatus,
        error: ErrorInfo | None,
        prompt_tokens: int,
        completion_tokens: int,
        timings: Timings | None = None,
    ) -> DispatchOutcome:
        return DispatchOutcome(
            request_id=dispatch.request_id,
            tenant=dispatch.routed.request.tenant,
            worker_id=self.worker_id,
            attempt=dispatch.attempt,
            status=status,
            error=error,
            model=dispatch.routed.model,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            ttft_ms=timings.ttft_ms if timings is not None else None,
            tpot_ms=timings.tpot_ms if timings is not None else None,
        )
