"""The topic catalog: every topic's name, key, value type, partitions and retention.

Services never spell topic names: they ask a `Topics` object, which also applies the
namespace prefix (`LLMBUS_TOPIC_PREFIX`) that lets tests and several stacks share a broker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmbus.contract import messages as m

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    name: str
    key: str
    value: type[m.Message]
    partitions: int = 4
    retention_ms: int = 7 * DAY_MS
    compacted: bool = False
    notes: str = ""
    extra_config: dict[str, str] = field(default_factory=dict)

    @property
    def writers(self) -> tuple[str, ...]:
        """Who declares writing it (llmbus.contract.contracts: the services' declarations, not a list kept here)."""
        from llmbus.contract.contracts import writers_of  # the contracts name the catalog's topics: imported late

        return writers_of(self.name)

    @property
    def readers(self) -> tuple[str, ...]:
        from llmbus.contract.contracts import readers_of

        return readers_of(self.name)

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
ARCHIVE = "archive"
NODE_AGENT = "node-agent"
ALL_SERVICES = (ROUTER, SCHEDULER, WORKER, COMPARATOR, AUTOSCALER, COST, GATEWAY, ARCHIVE, NODE_AGENT)

CATALOG: tuple[TopicSpec, ...] = (
    TopicSpec(
        REQUESTS,
        "session id, else request id",
        m.InferenceRequest,
        partitions=8,
        notes="replayable log of what clients asked",
    ),
    TopicSpec(
        ROUTED,
        "target model",
        m.RoutedRequest,
        partitions=8,
        notes="keyed by model so one scheduler instance owns a model",
    ),
    TopicSpec(
        TOKENS,
        "request id",
        m.TokenChunk,
        partitions=8,
        retention_ms=DAY_MS,
        notes="default reply topic; chunks batched, ordered by seq",
    ),
    TopicSpec(
        SHADOW_TOKENS,
        "request id",
        m.TokenChunk,
        partitions=4,
        retention_ms=DAY_MS,
        notes="reply topic of shadow copies; never read by clients",
    ),
    TopicSpec(
        RESULTS,
        "request id",
        m.InferenceResult,
        partitions=8,
        notes="exactly one final result per request id",
    ),
    TopicSpec(
        OUTCOMES,
        "request id",
        m.DispatchOutcome,
        partitions=4,
        notes="one per dispatch attempt: completed, failed, retryable",
    ),
    TopicSpec(
        WORKERS,
        "worker id",
        m.WorkerStatus,
        partitions=1,
        compacted=True,
        notes="heartbeats",
    ),
    TopicSpec(
        NODES,
        "node id",
        m.NodeProfile,
        partitions=1,
        compacted=True,
        notes="each node's hardware and health, from its node agent (else a worker's own probe)",
    ),
    TopicSpec(
        MODELS,
        "model name; name@version",
        m.ModelSpec,
        partitions=1,
        compacted=True,
        notes="the registry: the model as served (key: name) and one record per version (key: name@version)",
    ),
    TopicSpec(
        EXPERIMENTS,
        "experiment id",
        m.Experiment,
        partitions=1,
        compacted=True,
    ),
    TopicSpec(
        FEEDBACK,
        "request id",
        m.Feedback,
        partitions=4,
        notes="dev mode: every client; auth on: the gateway's alone (tenants write llm.feedback.<tenant>)",
    ),
    TopicSpec(
        COMPARISONS,
        "experiment id",
        m.Comparison,
        partitions=4,
        notes="one experiment's comparisons stay in order (one partition each); experiments spread",
    ),
    TopicSpec(
        DECISIONS,
        "experiment id",
        m.ExperimentDecision,
        partitions=4,
        retention_ms=30 * DAY_MS,
        notes="promote / hold / rollback with the evidence behind each; one experiment's stay in order",
    ),
    TopicSpec(
        SCALING,
        "pool",
        m.ScaleDecision,
        partitions=4,
        notes="one pool's decisions stay in order (readers keep the last per pool); pools spread",
    ),
    TopicSpec(
        POOL_STATS,
        "pool",
        m.PoolStats,
        partitions=1,
        retention_ms=DAY_MS,
        notes="per-pool queue wait, TTFT, prefill backlog, KV use, tokens: the scaling signals",
    ),
    TopicSpec(
        COSTS,
        "record id",
        m.CostRecord,
        partitions=8,
        notes="keyed by record id so a big tenant spreads over every partition: no reader needs one "
        "tenant's records in order (totals and budgets are sums kept in Redis, consumers dedupe by record "
        "id); a record published again (outbox replay) lands on its first copy's partition",
    ),
    TopicSpec(BUDGETS, "tenant", m.BudgetStatus, partitions=1, compacted=True),
    TopicSpec(PRICEBOOK, '"pricebook"', m.PriceBookUpdate, partitions=1, compacted=True),
    TopicSpec(CONTROL, "target id", m.Control, partitions=1),
    TopicSpec(
        DLQ,
        "original key",
        m.DeadLetter,
        partitions=1,
        retention_ms=30 * DAY_MS,
        notes="nothing is dropped silently",
    ),
)

DISPATCH_SPEC = TopicSpec(
    DISPATCH_PREFIX + "<worker_id>",
    "request id",
    m.Dispatch,
    partitions=1,
    retention_ms=DAY_MS,
    notes="one topic per worker; never key-hashed",
)

REPLIES_SPEC = TopicSpec(
    REPLIES_PREFIX + "<instance>",
    "request id",
    m.TokenChunk,
    # Its gateway instance reads it whole (no group), a worker continuing a cut answer reads it back: one is enough.
    partitions=1,
    retention_ms=DAY_MS,
    notes="reply topic of one gateway instance: the chunks of the requests it sent",
)

FEEDBACK_TENANT_SPEC = TopicSpec(
    FEEDBACK + ".<tenant>",
    "request id",
    m.Feedback,
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


def _retention(ms: int) -> str:
    return f"{ms // DAY_MS} d" if ms % DAY_MS == 0 else f"{ms} ms"


def catalog_table() -> str:
    """The catalog as the Markdown table docs/topics.md shows (a test keeps the two the same)."""
    rows = ["| topic | key | partitions | retention (default) | notes |", "|---|---|---|---|---|"]
    for spec in (*CATALOG, *PATTERN_SPECS):
        kept = "compacted" if spec.compacted else _retention(spec.retention_ms)
        rows.append(f"| `{spec.name}` | {spec.key} | {spec.partitions} | {kept} | {spec.notes} |")
    return "\n".join(rows) + "\n"
