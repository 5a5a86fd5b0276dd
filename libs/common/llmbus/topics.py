"""The topic catalog: every topic's name, key, value type, partitions and retention.

Services never spell topic names: they ask a `Topics` object, which also applies the
namespace prefix (`LLMBUS_TOPIC_PREFIX`) that lets tests and several stacks share a broker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmbus import messages as m

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    name: str
    key: str
    value: type[m.Message]
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    partitions: int = 4
    retention_ms: int = 7 * DAY_MS
    compacted: bool = False
    notes: str = ""
    extra_config: dict[str, str] = field(default_factory=dict)

    def config(self) -> dict[str, str]:
        cfg = {"retention.ms": str(self.retention_ms)}
        if self.compacted:
            cfg |= {"cleanup.policy": "compact", "min.compaction.lag.ms": "0", "segment.ms": "600000"}
        return cfg | self.extra_config


REQUESTS = "llm.requests"
ROUTED = "llm.routed"
DISPATCH_PREFIX = "llm.dispatch."
REPLIES_PREFIX = "llm.replies."
TOKENS = m.DEFAULT_REPLY_TOPIC
SHADOW_TOKENS = "llm.shadow"
RESULTS = "llm.results"
OUTCOMES = "llm.outcomes"
WORKERS = "llm.workers"
NODES = "llm.nodes"
MODELS = "llm.models"
EXPERIMENTS = "llm.experiments"
FEEDBACK = "llm.feedback"
COMPARISONS = "llm.comparisons"
DECISIONS = "llm.decisions"
SCALING = "llm.scaling"
POOL_STATS = "llm.pool-stats"
COSTS = "llm.costs"
BUDGETS = "llm.budgets"
PRICEBOOK = "llm.pricebook"
CONTROL = "llm.control"
DLQ = "llm.dlq"

CLIENT = "client"
ROUTER = "router"
SCHEDULER = "scheduler"
WORKER = "engine-worker"
COMPARATOR = "shadow-comparator"
AUTOSCALER = "autoscaler"
COST = "cost-accounting"
ANALYTICS = "analytics"
GATEWAY = "gateway"
ALL_SERVICES = (ROUTER, SCHEDULER, WORKER, COMPARATOR, AUTOSCALER, COST, GATEWAY)

CATALOG: tuple[TopicSpec, ...] = (
    TopicSpec(
        REQUESTS,
        "session id, else request id",
        m.InferenceRequest,
        (CLIENT, GATEWAY),
        (ROUTER,),
        partitions=8,
        notes="replayable log of what clients asked",
    ),
    TopicSpec(
        ROUTED,
        "target model",
        m.RoutedRequest,
        (ROUTER, SCHEDULER),  # the scheduler re-publishes a request it hands to a fallback model
        (SCHEDULER,),
        partitions=8,
        notes="keyed by model so one scheduler instance owns a model",
    ),
    TopicSpec(
        TOKENS,
        "request id",
        m.TokenChunk,
        (WORKER, ROUTER, SCHEDULER),  # router and scheduler write final chunks of requests they end
        (CLIENT,),
        partitions=8,
        retention_ms=DAY_MS,
        notes="default reply topic; chunks batched, ordered by seq",
    ),
    TopicSpec(
        SHADOW_TOKENS,
        "request id",
        m.TokenChunk,
        (WORKER, ROUTER, SCHEDULER),
        (COMPARATOR,),
        partitions=4,
        retention_ms=DAY_MS,
        notes="reply topic of shadow copies; never read by clients",
    ),
    TopicSpec(
        RESULTS,
        "request id",
        m.InferenceResult,
        (WORKER, ROUTER, SCHEDULER),
        (ROUTER, COMPARATOR, COST, AUTOSCALER, ANALYTICS, CLIENT),  # the router fills its cache from results
        partitions=8,
        notes="exactly one final result per request id",
    ),
    TopicSpec(
        OUTCOMES,
        "request id",
        m.DispatchOutcome,
        (WORKER,),
        (SCHEDULER,),
        partitions=4,
        notes="one per dispatch attempt: completed, failed, retryable",
    ),
    TopicSpec(
        WORKERS,
        "worker id",
        m.WorkerStatus,
        (WORKER,),
        (SCHEDULER, AUTOSCALER, COST, GATEWAY, ANALYTICS),
        partitions=1,
        compacted=True,
        notes="heartbeats",
    ),
    TopicSpec(NODES, "node id", m.NodeProfile, (WORKER,), (SCHEDULER, COST), partitions=1, compacted=True),
    TopicSpec(
        MODELS, "model name", m.ModelSpec, (CLIENT,), (ROUTER, SCHEDULER, WORKER, GATEWAY), partitions=1, compacted=True
    ),
    TopicSpec(
        EXPERIMENTS,
        "experiment id",
        m.Experiment,
        (CLIENT, COMPARATOR),
        (ROUTER, COMPARATOR),
        partitions=1,
        compacted=True,
    ),
    TopicSpec(
        FEEDBACK,
        "request id",
        m.Feedback,
        (CLIENT, GATEWAY),
        (COMPARATOR,),
        partitions=4,
        notes="dev mode: every client; auth on: the gateway's alone (tenants write llm.feedback.<tenant>)",
    ),
    TopicSpec(COMPARISONS, "experiment id", m.Comparison, (COMPARATOR,), (ANALYTICS,), partitions=1),
    TopicSpec(
        DECISIONS,
        "experiment id",
        m.ExperimentDecision,
        (COMPARATOR,),
        (CLIENT, ANALYTICS),
        partitions=1,
        retention_ms=30 * DAY_MS,
        notes="promote / hold / rollback with the evidence behind each",
    ),
    TopicSpec(SCALING, "pool", m.ScaleDecision, (AUTOSCALER,), (COST, ANALYTICS), partitions=1),
    TopicSpec(
        POOL_STATS,
        "pool",
        m.PoolStats,
        (SCHEDULER,),
        (AUTOSCALER,),
        partitions=1,
        retention_ms=DAY_MS,
        notes="per-pool queue wait, arrivals, in flight: the scaling signal",
    ),
    TopicSpec(COSTS, "tenant", m.CostRecord, (COST,), (COST, COMPARATOR, ANALYTICS), partitions=4),  # cost: aggregates
    TopicSpec(BUDGETS, "tenant", m.BudgetStatus, (COST,), (ROUTER, ANALYTICS), partitions=1, compacted=True),
    TopicSpec(PRICEBOOK, '"pricebook"', m.PriceBookUpdate, (CLIENT,), (COST,), partitions=1, compacted=True),
    TopicSpec(CONTROL, "target id", m.Control, (CLIENT, AUTOSCALER, GATEWAY), (WORKER, SCHEDULER), partitions=1),
    TopicSpec(
        DLQ,
        "original key",
        m.DeadLetter,
        ALL_SERVICES,
        (CLIENT,),  # operators: a dead letter may hold a prompt, which analytics does not read
        partitions=1,
        retention_ms=30 * DAY_MS,
        notes="nothing is dropped silently",
    ),
)

DISPATCH_SPEC = TopicSpec(
    DISPATCH_PREFIX + "<worker_id>",
    "request id",
    m.Dispatch,
    (SCHEDULER,),
    (WORKER,),
    partitions=1,
    retention_ms=DAY_MS,
    notes="one topic per worker; never key-hashed",
)

REPLIES_SPEC = TopicSpec(
    REPLIES_PREFIX + "<instance>",
    "request id",
    m.TokenChunk,
    (WORKER, ROUTER, SCHEDULER),
    (GATEWAY,),
    partitions=4,
    retention_ms=DAY_MS,
    notes="reply topic of one gateway instance: the chunks of the requests it sent",
)

FEEDBACK_TENANT_SPEC = TopicSpec(
    FEEDBACK + ".<tenant>",
    "request id",
    m.Feedback,
    (CLIENT,),
    (COMPARATOR,),
    partitions=1,
    notes="auth on: one tenant's feedback, written by that tenant only; its tenant is the topic's",
)

# Topics named per instance or tenant (a worker's dispatch topic, a gateway's reply topic, a tenant's feedback).
PATTERN_SPECS = (DISPATCH_SPEC, REPLIES_SPEC, FEEDBACK_TENANT_SPEC)

BY_NAME = {spec.name: spec for spec in CATALOG}


class Topics:
    """Topic names under one namespace prefix ('' in production)."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def name(self, base: str) -> str:
        return f"{self.prefix}{base}"

    def dispatch(self, worker_id: str) -> str:
        return self.name(DISPATCH_PREFIX + worker_id)

    def replies(self, instance: str) -> str:
        return self.name(replies_base(instance))

    def group(self, service: str, suffix: str = "") -> str:
        """Consumer group ids live in the same namespace as the topics."""
        return f"{self.prefix}llmbus.{service}{'.' + suffix if suffix else ''}"

    def spec_of(self, name: str) -> TopicSpec:
        base = name.removeprefix(self.prefix)
        if base.startswith(DISPATCH_PREFIX):
            return DISPATCH_SPEC
        if base.startswith(REPLIES_PREFIX):
            return REPLIES_SPEC
        if base.startswith(FEEDBACK + "."):
            return FEEDBACK_TENANT_SPEC
        return BY_NAME[base]

    def all_specs(self) -> list[tuple[str, TopicSpec]]:
        return [(self.name(spec.name), spec) for spec in CATALOG]


def replies_base(instance: str) -> str:
    """A gateway instance's reply topic, as a request names it (relative to the namespace)."""
    return REPLIES_PREFIX + instance
