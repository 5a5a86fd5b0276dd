"""Every service's declared subscriptions and publications (llmbus.contract.declarations).

Concurrency and batch sizes are the defaults; a service's settings may change them (never the topics).

The services subscribe through these (`ServiceRuntime.subscribe(contract.subscription(name), …)`
or, for the services that run their own ConsumerLoops, the same names), their tests compare the
topics their publisher wrote with `writes`, and the AsyncAPI documents, the topic catalog's
readers and writers (schemas/topics.json) and the service ACLs are generated from here.
`client` (the client library, the CLI and its jobs) and `analytics` (the stream jobs) are
declared too: they are the catalog's other readers and writers (operators' tools such as
`llmbus trace` also read every topic of their namespace, under their prefixed ACL).
"""

from __future__ import annotations

from llmbus.contract import messages as m
from llmbus.contract import topics as t
from llmbus.contract.declarations import Contract, Reads, Writes

DLQ = Writes(t.DLQ, m.DeadLetter, "records that could not be handled, with the reason")
FEEDBACK_TOPICS = (t.FEEDBACK, t.FEEDBACK_TENANT_SPEC.name)
REPLY_TOPICS = (t.TOKENS, t.SHADOW_TOKENS, t.REPLIES_SPEC.name)


def _replies() -> tuple[Writes, ...]:
    """Who ends a request writes its reply topic: the default, the shadow copies' or a gateway's."""
    return tuple(Writes(topic, m.TokenChunk) for topic in REPLY_TOPICS)


AUTOSCALER = Contract(
    t.AUTOSCALER,
    reads=(
        Reads("workers", (t.WORKERS,), m.WorkerStatus, group=None, notes="the fleet: heartbeats, whole table"),
        Reads("pool_stats", (t.POOL_STATS,), m.PoolStats, from_earliest=False, notes="only fresh ones matter"),
        Reads("scaling", (t.SCALING,), m.ScaleDecision, group=None, at_start=True, notes="its last decision per pool"),
    ),
    writes=(Writes(t.SCALING, m.ScaleDecision), DLQ),
)

COST = Contract(
    t.COST,
    reads=(
        Reads("workers", (t.WORKERS,), m.WorkerStatus, group=None, notes="the GPU ledger's worker lives"),
        Reads("pricebook", (t.PRICEBOOK,), m.PriceBookUpdate, group=None),
        Reads("scaling", (t.SCALING,), m.ScaleDecision, group="scaling"),
        Reads("results", (t.RESULTS,), m.InferenceResult, group="results", batch_max_records=2000, raw=True),
        Reads(
            "billed",
            (t.COSTS,),
            m.CostRecord,
            group=None,
            at_start=True,
            notes="after a Redis loss: what was billed",
        ),
    ),
    writes=(Writes(t.COSTS, m.CostRecord), Writes(t.BUDGETS, m.BudgetStatus), DLQ),
)

COMPARATOR = Contract(
    t.COMPARATOR,
    reads=(
        Reads("experiments", (t.EXPERIMENTS,), m.Experiment, group=None, raw=True, notes="tombstones forget one"),
        Reads("results", (t.RESULTS,), m.InferenceResult),
        Reads("costs", (t.COSTS,), m.CostRecord, group="costs"),
        # auth on: by pattern, llm.feedback and every llm.feedback.<tenant> (the tenant is the topic's)
        Reads("feedback", FEEDBACK_TOPICS, m.Feedback, group="feedback", raw=True),
    ),
    writes=(
        Writes(t.COMPARISONS, m.Comparison),
        Writes(t.DECISIONS, m.ExperimentDecision),
        Writes(t.EXPERIMENTS, m.Experiment, "the next step of a ramp, or a rollback"),
        DLQ,
    ),
)

ROUTER = Contract(
    t.ROUTER,
    reads=(
        # auth on: by pattern, llm.requests and every llm.requests.<tenant>
        Reads("requests", (t.REQUESTS,), m.InferenceRequest, max_in_flight=512),
        Reads("results", (t.RESULTS,), m.InferenceResult, group="results", max_in_flight=256, notes="the cache"),
        Reads("models", (t.MODELS,), m.ModelSpec, group=None),
        Reads("experiments", (t.EXPERIMENTS,), m.Experiment, group=None),
        Reads("budgets", (t.BUDGETS,), m.BudgetStatus, group=None),
    ),
    writes=(Writes(t.ROUTED, m.RoutedRequest), Writes(t.RESULTS, m.InferenceResult), *_replies(), DLQ),
)

SCHEDULER = Contract(
    t.SCHEDULER,
    reads=(
        Reads("routed", (t.ROUTED,), m.RoutedRequest, max_in_flight=10_000, notes="held: placed or waiting"),
        Reads("outcomes", (t.OUTCOMES,), m.DispatchOutcome, group="outcomes.<instance>", max_in_flight=256),
        Reads("workers", (t.WORKERS,), m.WorkerStatus, group=None),
        Reads("nodes", (t.NODES,), m.NodeProfile, group=None),
        Reads("models", (t.MODELS,), m.ModelSpec, group=None),
        Reads("control", (t.CONTROL,), m.Control, group=None),
    ),
    writes=(
        Writes(t.DISPATCH_SPEC.name, m.Dispatch),
        Writes(t.ROUTED, m.RoutedRequest, "a request handed to its fallback model"),
        Writes(t.RESULTS, m.InferenceResult),
        Writes(t.POOL_STATS, m.PoolStats),
        *_replies(),
        DLQ,
    ),
)

WORKER = Contract(
    t.WORKER,
    reads=(
        Reads("dispatch", (t.DISPATCH_SPEC.name,), m.Dispatch, group="<worker_id>", max_in_flight=256),
        # its own group, from the log's end: a cancel or drain sent before it was ready is not its
        Reads("control", (t.CONTROL,), m.Control, group="<worker_id>.control", from_earliest=False, max_in_flight=16),
        Reads("models", (t.MODELS,), m.ModelSpec, group=None, notes="read once at start, as a table"),
    ),
    writes=(
        Writes(t.RESULTS, m.InferenceResult),
        Writes(t.OUTCOMES, m.DispatchOutcome),
        Writes(t.WORKERS, m.WorkerStatus),
        Writes(t.NODES, m.NodeProfile),
        *_replies(),
        DLQ,
    ),
)

GATEWAY = Contract(
    t.GATEWAY,
    reads=(
        Reads("replies", (t.REPLIES_SPEC.name,), m.TokenChunk, group=None, from_earliest=False, notes="its own"),
        Reads("workers", (t.WORKERS,), m.WorkerStatus, group=None),
        Reads("models", (t.MODELS,), m.ModelSpec, group=None),
    ),
    writes=(
        Writes(t.REQUESTS, m.InferenceRequest),
        Writes(t.CONTROL, m.Control, "a cancel when the client hangs up"),
        Writes(t.FEEDBACK, m.Feedback),
        DLQ,
    ),
)

CLIENT = Contract(
    t.CLIENT,
    reads=(
        Reads("tokens", (t.TOKENS,), m.TokenChunk, group=None, from_earliest=False),
        Reads("results", (t.RESULTS,), m.InferenceResult, group=None),
        Reads("decisions", (t.DECISIONS,), m.ExperimentDecision, group=None),
        Reads("workers", (t.WORKERS,), m.WorkerStatus, group=None, notes="llmbus status, trace"),
        Reads("scaling", (t.SCALING,), m.ScaleDecision, group=None, notes="llmbus scaling"),
        # the router's retraining job (llmbus retrain): what was routed and the feedback on it
        Reads("routed", (t.ROUTED,), m.RoutedRequest, group=None),
        Reads("feedback", FEEDBACK_TOPICS, m.Feedback, group=None),
        # operators only: a dead letter may hold a prompt, which analytics does not read
        Reads("dlq", (t.DLQ,), m.DeadLetter, group=None, notes="llmbus trace, audit"),
    ),
    writes=(
        Writes(t.REQUESTS, m.InferenceRequest),
        Writes(t.MODELS, m.ModelSpec),
        Writes(t.EXPERIMENTS, m.Experiment),
        Writes(t.FEEDBACK, m.Feedback),
        Writes(t.FEEDBACK_TENANT_SPEC.name, m.Feedback),
        Writes(t.PRICEBOOK, m.PriceBookUpdate),
        Writes(t.CONTROL, m.Control),
    ),
)

ARCHIVE = Contract(
    t.ARCHIVE,
    # In batches, each committed after its Parquet files and manifest are in place (services/archive).
    reads=(
        Reads("results", (t.RESULTS,), m.InferenceResult, group="results", batch_max_records=5000, raw=True),
        Reads("costs", (t.COSTS,), m.CostRecord, group="costs", batch_max_records=5000, raw=True),
        Reads("comparisons", (t.COMPARISONS,), m.Comparison, group="comparisons", batch_max_records=5000, raw=True),
        # auth on: by pattern, every llm.feedback.<tenant> and llm.requests.<tenant> too (the tenant is the topic's)
        Reads("feedback", FEEDBACK_TOPICS, m.Feedback, group="feedback", batch_max_records=5000, raw=True),
        Reads(
            "requests",
            (t.REQUESTS,),
            m.InferenceRequest,
            group="requests",
            batch_max_records=5000,
            raw=True,
            notes="the prompts llmbus export rlhf joins (LLMBUS_ARCHIVE_PROMPTS=false: not read)",
        ),
    ),
    writes=(DLQ,),
)

ANALYTICS = Contract(
    t.ANALYTICS,
    reads=tuple(
        Reads(topic.removeprefix("llm."), (topic,), model)
        for topic, model in (
            (t.RESULTS, m.InferenceResult),
            (t.COMPARISONS, m.Comparison),
            (t.DECISIONS, m.ExperimentDecision),
            (t.SCALING, m.ScaleDecision),
            (t.COSTS, m.CostRecord),
            (t.BUDGETS, m.BudgetStatus),
            (t.WORKERS, m.WorkerStatus),
        )
    ),
)

SERVICES: tuple[Contract, ...] = (ROUTER, SCHEDULER, WORKER, COMPARATOR, AUTOSCALER, COST, GATEWAY, ARCHIVE)
ALL: tuple[Contract, ...] = (*SERVICES, CLIENT, ANALYTICS)
BY_SERVICE = {contract.service: contract for contract in ALL}


def writers_of(topic: str) -> tuple[str, ...]:
    """The roles that declare writing `topic` (a catalog name), in catalog order of services."""
    return tuple(c.service for c in ALL if topic in c.write_topics())


def readers_of(topic: str) -> tuple[str, ...]:
    return tuple(c.service for c in ALL if topic in c.read_topics())
