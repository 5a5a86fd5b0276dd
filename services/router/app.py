"""Router wiring: state followed (models, experiments, budgets), then requests; results fill the cache."""

from __future__ import annotations

import asyncio

from pydantic import SecretStr

from llmbus.bus.service import ServiceRuntime
from llmbus.contract import contracts
from llmbus.observability.metric_children import MODEL_LABELS
from llmbus.security import tenancy
from llmbus.settings import BusSettings
from llmbus.state.store import dispatch_markers, redis_client
from llmbus_services.router.adapters.cache import RedisResponseCache
from llmbus_services.router.adapters.coalescing import RedisCoalescer
from llmbus_services.router.adapters.embedders import build_embedder
from llmbus_services.router.adapters.latency_watch import LatencyReporter
from llmbus_services.router.adapters.limits import RedisRateLimiter
from llmbus_services.router.adapters.semantic_cache import RedisSemanticCache
from llmbus_services.router.config import RouterSettings
from llmbus_services.router.core.budgets import BudgetBook
from llmbus_services.router.core.complexity import build_scorer_with_fallback
from llmbus_services.router.core.config import RouterPolicy, load_policy, with_default_model
from llmbus_services.router.core.latency import TierLatencyWatch
from llmbus_services.router.core.pipeline import RouterCore
from llmbus_services.router.flows import RouterHandlers

RESULTS_FETCH_MIN_BYTES = 1024 * 1024  # a fetch of llm.results returns at this size or after results_fetch_wait_ms


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


def build(runtime: ServiceRuntime, router_settings: RouterSettings) -> RouterHandlers:
    """The router's flows bound to its declared subscriptions (llmbus.contract.contracts.ROUTER)."""
    settings = runtime.settings
    policy = load_policy(router_settings.policy_path)
    if router_settings.default_model:
        policy = with_default_model(policy, router_settings.default_model)
    MODEL_LABELS.learn(policy.models)  # the policy's models label metrics as themselves (others: `other`)
    core, budgets, cache, coalescer, semantic = build_core(
        policy,
        f"{settings.topic_prefix}router",
        settings.redis_url_of(router_settings.state_redis_url),
        settings.redis_password,
        router_settings.user_id_salt,
        redis_cluster=settings.redis_cluster,
    )
    runtime.on_stop(cache.close)
    reporter = LatencyReporter(core, core.latency) if core.latency is not None else None
    markers = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
    runtime.on_stop(markers.aclose)
    fence = dispatch_markers(markers, settings.topic_prefix, settings.final_marker_ttl_s)
    handlers = RouterHandlers(
        runtime.bus,
        router_settings,
        core,
        budgets,
        cache,
        reporter,
        fence,
        directory=runtime.bus.directory,
        coalescer=coalescer,
        semantic=semantic,
    )
    # Followed before the first request: experiments and budgets already in the log apply to it.
    runtime.subscribe("models", handlers.on_model, retries=False)
    runtime.subscribe("experiments", handlers.on_experiment, retries=False)
    runtime.subscribe("budgets", handlers.on_budget, retries=False)
    # Leaders' results answer their coalesced followers: that needs llm.results too.
    if (router_settings.cache_fill and policy.cache.enabled) or reporter is not None or coalescer is not None:
        wait_ms = router_settings.results_fetch_wait_ms
        fetch: dict[str, object] = {"fetch_max_wait_ms": wait_ms, "fetch_min_bytes": RESULTS_FETCH_MIN_BYTES}
        runtime.subscribe("results", handlers.on_result, retries=False, consumer_options=fetch if wait_ms else {})
    # With auth on, tenants write their own request topics: found by pattern (new ones within seconds).
    auth = settings.auth_enabled
    runtime.subscribe(
        "requests",
        handlers.on_request,
        pattern=tenancy.request_topic_pattern(runtime.topics.prefix) if auth else None,
        consumer_options={"metadata_max_age_ms": router_settings.request_topic_discovery_ms if auth else 300_000},
        retries=False,  # a request that fails is answered (a final error) and dead-lettered at once
        max_in_flight=router_settings.max_in_flight,
    )
    if handlers.coalesce is not None:
        runtime.task("coalescing sweep", handlers.coalesce.sweep)
    return handlers


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    runtime = await ServiceRuntime.connect(settings, contracts.ROUTER)
    build(runtime, RouterSettings())
    await runtime.run(stop)
