"""The request flow: decode → RouterCore → publish the routed request, or answer it. Bad input ends as
DLQ + final error.

A refusal (limits, budget, prompt too long) or a cache hit is not a bad message: it ends
as a final chunk on the client's reply topic and one InferenceResult, with no DLQ entry.
Such an answer first claims the request's final marker (llmbus.state.fencing, as attempt 0) the way a
worker claims its result: a request record delivered again after a crash or rebalance, whose first
delivery was routed to a worker, is not answered a second time from the cache (or refused by then-full
limits), and one whose first delivery was answered here but not marked done (a crash in between) finds
that answer on llm.results and publishes none.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka.structs import ConsumerRecord

from llmbus.bus import BadMessage, Bus, decode
from llmbus.bus.replies import publish_error, publish_result, reply_topic_of, result_out_since
from llmbus.bus.topic_directory import TopicDirectory, TopicExistence
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    ErrorCode,
    ErrorInfo,
    InferenceRequest,
    now_ms,
)
from llmbus.contract.request_key import RequestKey, request_key
from llmbus.security import tenancy
from llmbus.security.tenancy import Refused
from llmbus.state.fencing import RequestFence
from llmbus_services.router.adapters.cache import RedisResponseCache
from llmbus_services.router.adapters.coalesce_relay import CoalesceRelay
from llmbus_services.router.adapters.coalescing import RedisCoalescer
from llmbus_services.router.adapters.latency_watch import LatencyReporter
from llmbus_services.router.adapters.semantic_cache import RedisSemanticCache
from llmbus_services.router.config import RouterSettings
from llmbus_services.router.core.budgets import BudgetBook
from llmbus_services.router.core.pipeline import RouteOutcome, RouterCore

log = logging.getLogger(__name__)
ROUTER_ATTEMPT = 0  # the router's own answers, before any worker attempt (those count from 1)


class RequestFlow:
    def __init__(
        self,
        bus: Bus,
        settings: RouterSettings,
        core: RouterCore,
        budgets: BudgetBook,
        cache: RedisResponseCache | None = None,
        latency: LatencyReporter | None = None,
        fence: RequestFence | None = None,
        directory: TopicExistence | None = None,
        coalescer: RedisCoalescer | None = None,
        semantic: RedisSemanticCache | None = None,
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.core = core
        self.budgets = budgets
        self.cache = cache
        self.latency = latency
        self.fence = fence  # the final markers scheduler and workers share
        self.routed_topic = bus.topics.name(t.ROUTED)
        self.directory = directory or TopicDirectory(lambda: bus.producer, bus.settings.admin_timeout_s)
        self.semantic = semantic
        self.coalesce = (
            CoalesceRelay(bus, coalescer, core.policy.coalesce, self._claim_answer, self._answered)
            if coalescer is not None
            else None
        )

    async def on_request(self, record: ConsumerRecord) -> None:
        received_at_ms = now_ms()
        try:
            # The edge of the bus: over max_request_bytes is refused here, so what routing adds still fits.
            # A request without an id would be answered under a fresh one that its sender cannot know.
            request = decode(
                record, InferenceRequest, max_bytes=self.bus.settings.max_request_bytes, required=("request_id",)
            )
        except BadMessage as bad:
            await self._reject_bad(record, bad)
            return
        try:
            request = await self._authorise(record, request)
        except Refused as refused:
            await self._refuse(record, request, refused)
            return
        try:
            outcome = await self.core.route(request, received_at_ms)
        except Exception as exc:
            # Limits, budgets or cache unreachable (Redis): the client gets its final error now, and
            # the record goes to the DLQ with the reason (raised on to the ConsumerLoop).
            await self._answer_unrouted(request, exc)
            raise
        try:
            await self._publish(request, outcome)
        except Exception as exc:
            if outcome.routed is not None:
                await self._answer_unrouted(request, exc)
            raise  # and the record goes to the DLQ with the reason

    async def _answer_unrouted(self, request: InferenceRequest, exc: Exception) -> None:
        """The request could not be routed (limits, budgets or cache unreachable) or its routed record
        did not go out (the broker stayed away past publish_retry_s, or refused it): the client gets its
        final error. The answer is claimed first, so if the routed record is written after all (or the
        request comes again), the attempt that runs it publishes no second result."""
        if not await self._claim_answer(request.request_key):
            return
        await publish_error(
            self.bus.publisher,
            self.bus.topics,
            request_id=request.request_id,
            tenant=request.tenant,
            error=ErrorInfo(
                code=ErrorCode.INTERNAL,
                message=f"could not route the request: {type(exc).__name__}: {exc}"[:2000],
                retryable=True,
                retry_after_ms=1000,
            ),
            produced_by=self.bus.service,
            reply_topic=reply_topic_of(self.bus.topics, request.reply_topic),
            attempt=ROUTER_ATTEMPT,
            **self.core.request_facts(request, "unroutable"),
        )
        await self._answered(request.request_key)

    async def _authorise(self, record: ConsumerRecord, request: InferenceRequest) -> InferenceRequest:
        """The request as the authenticated tenant's, with a reply topic it may use; else Refused."""
        source = tenancy.source_of(record.topic.removeprefix(self.bus.topics.prefix))
        tenant = tenancy.check_tenant(source, request.tenant)
        exists = await self.directory.exists(self.bus.topics.name(request.reply_topic))
        problem = tenancy.reply_topic_problem(
            request.reply_topic,
            source,
            auth=self.bus.settings.auth_enabled,
            exists=exists,
            allowed_prefix=self.settings.allowed_reply_topic_prefix,
        )
        if problem:
            raise Refused(problem)
        return request if tenant == request.tenant else request.model_copy(update={"tenant": tenant})

    async def _refuse(self, record: ConsumerRecord, request: InferenceRequest, refused: Refused) -> None:
        """DLQ (the audit trail of refusals) and a final error on the tenant's default reply topic.

        The error claims the final marker like every other answer: a refused copy of a request id
        that a worker answers (or already did) is not a second result, which cost-accounting would
        bill ($0) in place of the real one."""
        await self.bus.send_dead_letter(record, ErrorCode.FORBIDDEN, refused.reason, request.request_id)
        try:
            source = tenancy.source_of(record.topic.removeprefix(self.bus.topics.prefix))
        except Refused:  # not a request topic we know a tenant of: answer on llm.results only
            source = None
        tenant = (source.tenant if source else None) or request.tenant
        # The marker of the request as the authenticated tenant's: the one its real copy would take.
        key = request_key(tenant, request.request_id)
        if not await self._claim_answer(key):
            log.info(
                "%s: refused copy of a request answered (or in flight) already; no second result", request.request_id
            )
            return
        await publish_error(
            self.bus.publisher,
            self.bus.topics,
            request_id=request.request_id,
            tenant=tenant,
            error=ErrorInfo.of(ErrorCode.FORBIDDEN, refused.reason),
            produced_by=self.bus.service,
            attempt=ROUTER_ATTEMPT,
            reply_topic=await self._fallback_reply_topic(tenant) if source is not None else None,
            **self.core.request_facts(request.model_copy(update={"tenant": tenant}), "refused:forbidden"),
        )
        await self._answered(key)

    def _authenticated_tenant(self, record: ConsumerRecord) -> str | None:
        try:
            return tenancy.source_of(record.topic.removeprefix(self.bus.topics.prefix)).tenant
        except Refused:
            return None

    async def _fallback_reply_topic(self, tenant: str) -> str | None:
        """The tenant's default reply topic; None (result on llm.results only) if it does not exist,
        so a refusal never waits on metadata of a missing topic."""
        topic = self.bus.topics.name(tenancy.default_reply_topic(self.bus.settings.auth_enabled, tenant))
        return topic if await self.directory.exists(topic) else None

    async def _publish(self, request: InferenceRequest, outcome: RouteOutcome) -> None:
        publisher = self.bus.publisher
        if outcome.parked_behind is not None:
            log.debug("%s: coalesced behind %s", request.request_id, outcome.parked_behind)
            return  # answered when the leader's result comes (CoalesceRelay), or routed alone after max_wait_s
        if outcome.result is not None:
            if not await self._claim_answer(request.request_key):
                log.info(
                    "%s: already routed or answered (a redelivered request); not answered again", request.request_id
                )
                return
            reply_topic = reply_topic_of(self.bus.topics, request.reply_topic)
            # The answer carries the attempt it claimed the final marker with, chunks included.
            mine = {"attempt": ROUTER_ATTEMPT}
            await publish_result(
                publisher,
                self.bus.topics,
                outcome.result.model_copy(update=mine),
                reply_topic,
                content_chunks=[chunk.model_copy(update=mine) for chunk in outcome.content_chunks],
                retry_for_s=self.bus.settings.publish_retry_s,
            )
            await self._answered(request.request_key)
            return
        assert outcome.routed is not None
        # The primary and its shadow copies go out together; the record is done when all are acknowledged.
        await asyncio.gather(
            *[
                publisher.publish(
                    self.routed_topic,
                    routed,
                    key=routed.model,
                    request_id=routed.request_id,
                    tenant=routed.request.tenant,
                    # Through a broker restart: failing here would leave the request to the DLQ, unanswered.
                    retry_for_s=self.bus.settings.publish_retry_s,
                )
                for routed in [outcome.routed, *outcome.shadows]
            ]
        )

    async def _claim_answer(self, key: RequestKey) -> bool:
        """False when a worker attempt or an earlier delivery owns the result, as for a worker's claim
        (llmbus.state.fencing's `claim_first`): a claim taken over from an earlier one never marked done
        (this router crashed between publishing its answer and marking it, the record came again) first
        reads llm.results from that claim's time, and a result already there is the answer, marked done
        now. Redis or llm.results unreachable: answer anyway (a second result needs a redelivery during
        the outage; no answer would be certain)."""
        if self.fence is None:
            return True
        try:
            claim = await self.fence.claim_first(key, ROUTER_ATTEMPT, now_ms())
            if not claim.claimed:
                return False
            if claim.after_earlier:
                # A pending claim lives for its lease at most: with no time kept, it is no older than that.
                since_ms = claim.earlier_claim_ms or now_ms() - self.fence.claim_lease_ms
                bus = self.bus
                out = await result_out_since(bus.settings, bus.topics, key, since_ms, service=bus.service)
                if out is not None:
                    log.warning("%s: attempt %d's result is out already; not answered again", key, out)
                    await self.fence.final_published(key, out)
                    return False
            return True
        except Exception:
            log.warning("final marker of %s unreachable; answering without it", key, exc_info=True)
            return True

    async def _answered(self, key: RequestKey) -> None:
        if self.fence is None:
            return
        try:
            await self.fence.final_published(key, ROUTER_ATTEMPT)
        except Exception:  # the pending claim's lease runs out by itself
            log.warning("could not mark %s answered", key, exc_info=True)

    async def _reject_bad(self, record: ConsumerRecord, bad: BadMessage) -> None:
        await self.bus.send_dead_letter(record, bad.code, bad.reason, bad.request_id)
        if bad.request_id is None:
            return  # nobody to answer: the DLQ entry is the only trace
        tenant = self._authenticated_tenant(record) or bad.tenant or "default"
        if not await self._claim_answer(request_key(tenant, bad.request_id)):
            return  # that tenant's request of that id was answered already (or is in flight): one result each
        await publish_error(
            self.bus.publisher,
            self.bus.topics,
            request_id=bad.request_id,
            tenant=tenant,
            error=ErrorInfo.of(bad.code, bad.reason),
            produced_by=self.bus.service,
            attempt=ROUTER_ATTEMPT,
            reply_topic=await self._fallback_reply_topic(tenant),
        )
        await self._answered(request_key(tenant, bad.request_id))
