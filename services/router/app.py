"""Router wiring: state followers (models, experiments, budgets), the request loop, cache filling."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from aiokafka.structs import ConsumerRecord
from pydantic import SecretStr

from llmbus.bus import Bus, ConsumerLoop, make_consumer, stop_consumer
from llmbus.bus.runtime import run_until_stopped
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.security import tenancy
from llmbus.settings import BusSettings
from llmbus.state.store import dispatch_markers, redis_client
from llmbus_services.router.adapters.cache import RedisResponseCache
from llmbus_services.router.adapters.coalescing import RedisCoalescer
from llmbus_services.router.adapters.embedders import build_embedder
from llmbus_services.router.adapters.latency_watch import LatencyReporter
from llmbus_services.router.adapters.limits import RedisRateLimiter
from llmbus_services.router.adapters.semantic_cache import RedisSemanticCache
from llmbus_services.router.adapters.state_follow import caught_up
from llmbus_services.router.config import RouterSettings
from llmbus_services.router.core.budgets import BudgetBook
from llmbus_services.router.core.complexity import build_scorer_with_fallback
from llmbus_services.router.core.config import RouterPolicy, load_policy, with_default_model
from llmbus_services.router.core.latency import TierLatencyWatch
from llmbus_services.router.core.pipeline import RouterCore
from llmbus_services.router.handlers import RouterHandlers


def build_core(
    policy: RouterPolicy,
    redis_namespace: str,
    redis_url: str,
    redis_password: SecretStr | None = None,
    user_id_salt: SecretStr | None = None,
    redis_cluster: bool = False,
) -> tuple[RouterCore, BudgetBook, RedisResponseCache, RedisCoalescer | None, RedisSemanticCache | None]:
    client = redis_client(redis_url, password=redis_password, cluster=redis_cluster)
    budgets = BudgetBook()
    cache = RedisResponseCache(
        client, redis_namespace, policy.cache.ttl_s, policy.cache.pending_ttl_s, policy.cache.max_text_bytes
    )
    watch = TierLatencyWatch(policy.latency) if policy.latency.enabled else None
    coalescer = (
        RedisCoalescer(client, redis_namespace, policy.coalesce.lead_ttl_s, policy.coalesce.max_wait_s)
        if policy.coalesce.enabled and policy.cache.enabled
        else None
    )
    semantic = (
        RedisSemanticCache(
            client,
            redis_namespace,
            build_embedder(policy.semantic_cache.embedder),
            policy.semantic_cache,
            cache,
            policy.cache.pending_ttl_s,
        )
        if policy.semantic_cache.enabled and policy.cache.enabled
        else None
    )
    core = RouterCore(
        policy,
        build_scorer_with_fallback(policy.scorer.name, policy.scorer.params, policy.scorer.fallback),
        limiter=RedisRateLimiter(client, redis_namespace),
        cache=cache,
        budgets=budgets,
        latency=watch,
        coalescer=coalescer,
        semantic=semantic,
        user_id_salt=user_id_salt.get_secret_value() if user_id_salt else "",
    )
    return core, budgets, cache, coalescer, semantic


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    router_settings = RouterSettings()
    policy = load_policy(router_settings.policy_path)
    if router_settings.default_model:
        policy = with_default_model(policy, router_settings.default_model)
    bus = await Bus.start(settings, t.ROUTER)
    topics = bus.topics
    state_redis_url = router_settings.state_redis_url or settings.redis_url
    core, budgets, cache, coalescer, semantic = build_core(
        policy,
        f"{settings.topic_prefix}router",
        state_redis_url,
        settings.redis_password,
        router_settings.user_id_salt,
        redis_cluster=settings.redis_cluster,
    )
    reporter = LatencyReporter(core, core.latency) if core.latency is not None else None
    markers = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
    fence = dispatch_markers(markers, settings.topic_prefix, settings.final_marker_ttl_s)
    handlers = RouterHandlers(
        bus, router_settings, core, budgets, cache, reporter, fence, coalescer=coalescer, semantic=semantic
    )

    state = make_consumer(
        settings,
        topics.name(t.MODELS),
        topics.name(t.EXPERIMENTS),
        topics.name(t.BUDGETS),
        group_id=None,
        client_id="llmbus-router-state",
    )
    state_loop = ConsumerLoop(
        state, _state_dispatch(handlers, topics), bus.dead_letter, settings, service=t.ROUTER, commit_offsets=False
    )
    # With auth on, tenants write their own request topics: found by pattern (new ones within seconds).
    discovery_ms = router_settings.request_topic_discovery_ms if settings.auth_enabled else 300_000  # aiokafka's
    requests = make_consumer(
        settings,
        group_id=contracts.ROUTER.group_id("requests", topics),
        client_id="llmbus-router",
        metadata_max_age_ms=discovery_ms,
    )
    request_loop = ConsumerLoop(
        requests,
        handlers.on_request,
        bus.dead_letter,
        settings,
        service=t.ROUTER,
        max_in_flight=router_settings.max_in_flight,
    )
    consumers = [state]
    loops = [state_loop]
    # Leaders' results answer their coalesced followers: that needs llm.results too.
    if (router_settings.cache_fill and policy.cache.enabled) or reporter is not None or coalescer is not None:
        # Earliest on a new group: a few stale results only miss their (expired) pending marks.
        group = contracts.ROUTER.group_id("results", topics)
        results = make_consumer(settings, group_id=group, client_id="llmbus-router-results")
        results_loop = ConsumerLoop(
            results, handlers.on_result, bus.dead_letter, settings, service=t.ROUTER, max_in_flight=256
        )
        results.subscribe([topics.name(t.RESULTS)], listener=results_loop.rebalance_listener())
        consumers.append(results)
        loops.append(results_loop)
    if settings.auth_enabled:
        requests.subscribe(
            pattern=tenancy.request_topic_pattern(topics.prefix), listener=request_loop.rebalance_listener()
        )
    else:
        requests.subscribe([topics.name(t.REQUESTS)], listener=request_loop.rebalance_listener())
    consumers.append(requests)
    try:
        # All consumers join at once (group joins are the slow part of a start) ...
        await asyncio.gather(*[asyncio.wait_for(c.start(), settings.admin_timeout_s) for c in consumers])
        tasks = [asyncio.create_task(loop.run(stop)) for loop in loops]
        # ... but requests wait for the state: experiments and budgets already in the log apply to the first one.
        await caught_up(state, state_loop, router_settings.state_catch_up_s)
        tasks.append(asyncio.create_task(request_loop.run(stop)))
        if handlers.coalesce is not None:
            tasks.append(asyncio.create_task(handlers.coalesce.sweep(stop)))
        await run_until_stopped(tasks, stop)
    finally:
        for consumer in consumers:
            await stop_consumer(consumer, settings.stop_timeout_s)
        with contextlib.suppress(Exception):
            await cache.close()
        with contextlib.suppress(Exception):
            await markers.aclose()
        await bus.stop()


def _state_dispatch(handlers: RouterHandlers, topics: t.Topics) -> Callable[[ConsumerRecord], Awaitable[None]]:
    by_topic = {
        topics.name(t.MODELS): handlers.on_model,
        topics.name(t.EXPERIMENTS): handlers.on_experiment,
        topics.name(t.BUDGETS): handlers.on_budget,
    }

    async def dispatch(record: ConsumerRecord) -> None:
        await by_topic[record.topic](record)

    return dispatch
