"""shadow-comparator wiring: a FastStream app with four subscribers and two timers.

Subscribers (at-least-once: a record's offset is committed after its handler returned,
a failing handler's record is delivered again — NACK_ON_ERROR):
  llm.results      group llmbus.shadow-comparator          joins pairs, counts A/B variants
  llm.costs        group llmbus.shadow-comparator.costs    cost per A/B request
  llm.feedback     group llmbus.shadow-comparator.feedback feedback per A/B request (auth on: by
                   pattern, llm.feedback and every llm.feedback.<tenant>; the tenant is the topic's)
  llm.experiments  no group, from the start                 the experiments' current state
Timers: the sweeper (expired pairs) and the decision loop (verdicts, ramps, rollbacks), the latter
in one instance at a time (a Redis lease), so several comparators never ramp the same step twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable

from faststream import FastStream
from faststream.kafka import KafkaBroker
from faststream.middlewares import AckPolicy
from prometheus_client import start_http_server

from llmbus import tenancy
from llmbus import topics as t
from llmbus.bus.security import faststream_security
from llmbus.messages import Comparison
from llmbus.settings import BusSettings
from llmbus.state import redis_client
from llmbus.telemetry import setup_logging, setup_tracing
from services.shadow_comparator.comparator import Comparator, ExperimentView
from services.shadow_comparator.config import ComparatorSettings
from services.shadow_comparator.handlers import BrokerPublisher, ComparatorHandlers
from services.shadow_comparator.store import ComparatorStore

log = logging.getLogger(__name__)


def build(settings: BusSettings, cfg: ComparatorSettings) -> tuple[FastStream, KafkaBroker, ComparatorHandlers]:
    topics = t.Topics(settings.topic_prefix)
    broker = KafkaBroker(
        settings.kafka_bootstrap,
        client_id=f"llmbus-{t.COMPARATOR}",
        security=faststream_security(settings),
        acks="all",
        enable_idempotence=True,
        request_timeout_ms=settings.request_timeout_ms,
        graceful_timeout=settings.stop_timeout_s,
        log_level=logging.DEBUG,  # FastStream's per-message "Received/Processed" lines: debug only
        # A new tenant's feedback topic joins the pattern subscription at the next metadata refresh.
        metadata_max_age_ms=cfg.feedback_topic_discovery_ms if settings.auth_enabled else 300_000,  # aiokafka's
    )
    store = ComparatorStore(
        redis_client(settings.redis_url, password=settings.redis_password),
        f"{settings.topic_prefix}comparator",
        cfg.pair_ttl_s,
        cfg.done_ttl_s,
    )
    publisher = BrokerPublisher(broker, t.COMPARATOR, settings.send_timeout_s)

    async def publish_comparison(comparison: Comparison) -> None:
        await publisher.publish(
            topics.name(t.COMPARISONS), comparison, key=comparison.experiment_id, request_id=comparison.request_id
        )

    comparator = Comparator(store, ExperimentView(), publish_comparison, max_text_chars=cfg.max_text_chars)
    handlers = ComparatorHandlers(comparator, publisher, topics)

    def at_least_once(
        topic: str | None, group: str, handler: Callable[..., Awaitable[None]], pattern: str | None = None
    ) -> None:
        broker.subscriber(
            *([topic] if topic else []),
            pattern=pattern,
            group_id=group,
            auto_offset_reset="earliest",
            ack_policy=AckPolicy.NACK_ON_ERROR,
        )(handler)

    # No group: every instance reads the whole compacted topic from the start and commits nothing.
    broker.subscriber(topics.name(t.EXPERIMENTS), auto_offset_reset="earliest", ack_policy=AckPolicy.MANUAL)(
        handlers.on_experiment
    )
    at_least_once(topics.name(t.RESULTS), topics.group(t.COMPARATOR), handlers.on_result)
    at_least_once(topics.name(t.COSTS), topics.group(t.COMPARATOR, "costs"), handlers.on_cost)
    feedback_group = topics.group(t.COMPARATOR, "feedback")
    if settings.auth_enabled:  # tenants write their own topics: the tenant of a record is its topic's
        at_least_once(None, feedback_group, handlers.on_feedback, pattern=tenancy.feedback_topic_pattern(topics.prefix))
    else:
        at_least_once(topics.name(t.FEEDBACK), feedback_group, handlers.on_feedback)

    app = FastStream(broker)
    timers: list[asyncio.Task[None]] = []

    @app.after_startup
    async def start_timers() -> None:
        timers.append(asyncio.create_task(_every(cfg.sweep_interval_s, "sweep", comparator.sweep)))
        if cfg.decide:
            owner = f"{socket.gethostname()}-{os.getpid()}"
            lease_s = cfg.decide_interval_s * 3

            async def tick() -> None:
                if await store.lead(owner, lease_s):
                    await decide_once(handlers)

            timers.append(asyncio.create_task(_every(cfg.decide_interval_s, "decide", tick)))

    @app.on_shutdown
    async def stop_timers() -> None:
        for task in timers:
            task.cancel()
        for task in timers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await store.close()

    return app, broker, handlers


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
        await handlers.publish_decision(decision, verdict.updated)
        if verdict.updated is not None:  # applied here at once: the next tick must not decide on the old step
            handlers.comparator.experiments.apply(verdict.updated)


async def _every(interval_s: float, name: str, job: Callable[[], Awaitable[object]]) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await job()
        except Exception:  # a failed tick (Redis or Kafka hiccup) is retried on the next one
            log.exception("%s tick failed", name)


def main() -> None:
    settings = BusSettings()
    setup_logging(t.COMPARATOR, settings.log_level, settings.log_json)
    setup_tracing(t.COMPARATOR, settings, console=settings.otel_console)
    if settings.metrics_port:  # on LLMBUS_METRICS_HOST (loopback unless set), as every service
        start_http_server(settings.metrics_port, addr=settings.metrics_host)
    app, _, _ = build(settings, ComparatorSettings())
    asyncio.run(app.run())
