"""shadow-comparator wiring: five declared subscriptions (llmbus.contract.contracts.COMPARATOR) and two timers.

Subscriptions (at least once: a record's offset is committed after its handler returned; a
transient failure is retried, a bad record goes to llm.dlq with the reason — llmbus.bus.service):
  llm.results      group llmbus.shadow-comparator          joins pairs, counts A/B variants
  llm.costs        group llmbus.shadow-comparator.costs    cost per A/B request
  llm.feedback     group llmbus.shadow-comparator.feedback feedback per A/B request (auth on: by
                   pattern, llm.feedback and every llm.feedback.<tenant>; the tenant is the topic's)
  llm.experiments  no group, from the start                 the experiments' current state
  llm.models       no group, from the start                 the registry a release's steps are written to
Timers: the sweeper (expired pairs) and the decision loop (verdicts, ramps, rollbacks), the latter
in one instance at a time (a Redis lease), so several comparators never ramp the same step twice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from llmbus.bus.service import ServiceRuntime
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import Comparison
from llmbus.security import tenancy
from llmbus.settings import BusSettings
from llmbus.state.experiment_versions import ExperimentVersions
from llmbus.state.store import redis_client
from llmbus_services.shadow_comparator.adapters.store import ComparatorStore
from llmbus_services.shadow_comparator.config import ComparatorSettings
from llmbus_services.shadow_comparator.core.comparator import Comparator, ExperimentView
from llmbus_services.shadow_comparator.flows import ComparatorHandlers

log = logging.getLogger(__name__)


def build(runtime: ServiceRuntime, cfg: ComparatorSettings) -> ComparatorHandlers:
    settings, topics = runtime.settings, runtime.topics
    client = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
    store = ComparatorStore(client, f"{settings.topic_prefix}comparator", cfg.pair_ttl_s, cfg.done_ttl_s)

    async def publish_comparison(comparison: Comparison) -> None:
        await runtime.publisher.publish(
            topics.name(t.COMPARISONS), comparison, key=comparison.experiment_id, request_id=comparison.request_id
        )

    runtime.on_stop(store.close)
    view = ExperimentView(linger_ms=cfg.pair_ttl_s * 1000)  # a pair mirrored before a promote may still complete
    comparator = Comparator(store, view, publish_comparison, max_text_chars=cfg.max_text_chars)
    handlers = ComparatorHandlers(
        comparator, runtime.publisher, topics, ExperimentVersions(client, settings.topic_prefix)
    )

    runtime.subscribe("experiments", handlers.on_experiment)
    runtime.subscribe("models", handlers.on_model)
    runtime.subscribe("results", handlers.on_result)
    runtime.subscribe("costs", handlers.on_cost)
    if settings.auth_enabled:  # tenants write their own topics: the tenant of a record is its topic's
        runtime.subscribe(
            "feedback",
            handlers.on_feedback,
            pattern=tenancy.feedback_topic_pattern(topics.prefix),
            # A new tenant's feedback topic joins the pattern subscription at the next metadata refresh.
            consumer_options={"metadata_max_age_ms": cfg.feedback_topic_discovery_ms},
        )
    else:
        runtime.subscribe("feedback", handlers.on_feedback)

    runtime.every(cfg.sweep_interval_s, "sweep", comparator.sweep)
    if cfg.decide:
        owner = f"{socket.gethostname()}-{os.getpid()}"
        lease_s = cfg.decide_interval_s * 3

        async def tick() -> None:
            if await store.lead(owner, lease_s):
                await decide_once(handlers)

        runtime.every(cfg.decide_interval_s, "decide", tick)
    return handlers


async def decide_once(handlers: ComparatorHandlers) -> None:
    for verdict in await handlers.comparator.decide_all():
        decision = verdict.decision
        log.info(
            "decision %s for %s: %s -> %s %% (%s)",
            decision.decision,
            decision.experiment_id,
            decision.share_from_pct,
            decision.share_to_pct,
            "; ".join(decision.reasons),
            extra={"fields": {"decision": decision.model_dump(mode="json")}},
        )
        in_force = await handlers.publish_decision(decision, verdict.updated)
        if in_force is not None:  # applied here at once: the next tick must not decide on the old step
            handlers.comparator.experiments.apply(in_force)


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    await ServiceRuntime.serve(
        settings, contracts.COMPARATOR, lambda runtime: build(runtime, ComparatorSettings()), stop
    )
