"""Answers coalesced followers: on their leader's result (llm.results), or when they waited too long.

Thin: Redis state from coalescing.py, decisions from core/coalesce.py, publishing through the
router's answer path (final marker claimed as the router's attempt 0, like a cache hit).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from llmbus.bus import Bus
from llmbus.bus.replies import publish_result, reply_topic_of
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceResult, RoutedRequest
from llmbus.contract.request_key import RequestKey
from llmbus.process.periodic import run_every
from llmbus_services.router.adapters.coalescing import RedisCoalescer
from llmbus_services.router.core.coalesce import outcome_for, own_generation
from llmbus_services.router.core.config import CoalescePolicy
from llmbus_services.router.core.pipeline import RouteOutcome

log = logging.getLogger(__name__)
COALESCED = Counter(
    "llmbus_router_coalesced_total", "Requests answered from another identical request's generation (billed as hits)"
)
COALESCE_SHARED_ERRORS = Counter(
    "llmbus_router_coalesce_shared_errors_total", "Followers ended with their leader's error (same input, same error)"
)
COALESCE_FALLBACKS = Counter(
    "llmbus_router_coalesce_fallbacks_total", "Followers sent to their own generation", ["reason"]
)

Claim = Callable[[RequestKey], Awaitable[bool]]


class CoalesceRelay:
    def __init__(
        self,
        bus: Bus,
        store: RedisCoalescer,
        policy: CoalescePolicy,
        claim_answer: Claim,
        answered: Callable[[RequestKey], Awaitable[None]],
    ) -> None:
        self.bus = bus
        self.store = store
        self.policy = policy
        self._claim_answer = claim_answer  # the request's final marker (one result per request id)
        self._answered = answered
        self.routed_topic = bus.topics.name(t.ROUTED)

    async def on_result(self, result: InferenceResult) -> None:
        """A final result: if it was a leader's, every follower behind it is answered or routed."""
        if result.shadow or result.cached:
            return  # neither leads: shadows never coalesce, a cached answer generated nothing
        followers = await self.store.finish(result.request_key)
        if followers:
            await asyncio.gather(*[self._follow_up(fid, result) for fid in followers])

    async def _follow_up(self, follower_id: str, leader: InferenceResult) -> None:
        follower = await self.store.claim(follower_id)
        if follower is None:
            return
        if follower.request.tenant != leader.tenant:  # the key carries the tenant: this cannot happen
            log.error("follower %s of %s crosses tenants; routed alone", follower_id, leader.request_id)
            await self._route_alone(follower, "tenant_mismatch")
            return
        outcome = outcome_for(follower, leader, self.policy)
        if outcome.routed is not None:
            COALESCE_FALLBACKS.labels("leader_tool_calls" if leader.tool_calls else "leader_failed").inc()
            await self._publish_routed(outcome.routed)
        else:
            await self._publish_answer(follower, outcome)
        await self.store.done(follower_id)

    async def _publish_answer(self, follower: RoutedRequest, outcome: RouteOutcome) -> None:
        assert outcome.result is not None
        if not await self._claim_answer(follower.request_key):
            log.info("%s: answered already; the coalesced answer is not sent again", follower.request_id)
            return
        await publish_result(
            self.bus.publisher,
            self.bus.topics,
            outcome.result,
            reply_topic_of(self.bus.topics, follower.request.reply_topic),
            content_chunks=outcome.content_chunks,
        )
        await self._answered(follower.request_key)
        if outcome.result.cached:
            COALESCED.inc()
        else:
            COALESCE_SHARED_ERRORS.inc()

    async def _route_alone(self, follower: RoutedRequest, why: str) -> None:
        COALESCE_FALLBACKS.labels(why).inc()
        await self._publish_routed(own_generation(follower, why))
        await self.store.done(follower.request_key)

    async def _publish_routed(self, routed: RoutedRequest) -> None:
        await self.bus.publisher.publish(
            self.routed_topic, routed, key=routed.model, request_id=routed.request_id, tenant=routed.request.tenant
        )

    async def sweep_once(self) -> int:
        """Route every follower whose leader's result is overdue; how many were routed."""
        routed = 0
        for follower_id in await self.store.overdue():
            follower = await self.store.claim(follower_id)
            if follower is not None:
                await self._route_alone(follower, "timeout")
                routed += 1
        return routed

    async def sweep(self, stop: asyncio.Event) -> None:
        """Every replica sweeps; the claim makes each follower one replica's."""
        await run_every(self.policy.sweep_interval_s, self.sweep_once, name="coalescing sweep", stop=stop, at_once=True)
