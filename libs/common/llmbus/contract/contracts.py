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


# Whether a result is already out, read by key from the time of a claim nobody marked done (its claimant
# died or stalled between publishing and marking): the claim discipline of workers, the scheduler's
# final errors and the router's own answers (llmbus.state.fencing, llmbus.bus.replies.result_out_since).
RESULT_LOOKUP = Reads(
    "result_out",
    (t.RESULTS,),
    m.InferenceResult,
    group=None,
    on_demand=True,
    notes="a lapsed claim's result looked up by request key before publishing another",
)


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
        Reads("models", (t.MODELS,), m.ModelSpec, group=None, raw=True, notes="the registry a release follows"),
        Reads("results", (t.RESULTS,), m.InferenceResult),
        Reads("costs", (t.COSTS,), m.CostRecord, group="costs"),
        # auth on: by pattern, llm.feedback and every llm.feedback.<tenant> (the tenant is the topic's)
        Reads("feedback", FEEDBACK_TOPICS, m.Feedback, group="feedback", raw=True),
    ),
    writes=(
        Writes(t.COMPARISONS, m.Comparison),
        Writes(t.DECISIONS, m.ExperimentDecision),
        Writes(t.EXPERIMENTS, m.Experiment, "the next step of a ramp, or a rollback"),
        Writes(t.MODELS, m.ModelSpec, "a release's step in the registry: the version's state, the serving record"),
        DLQ,
    ),
)

ROUTER = Contract(
    t.ROUTER,
    reads=(
        # auth on: by pattern, llm.requests and every llm.requests.<tenant> (the tenant is the topic's)
        Reads("requests", (t.REQUESTS,), m.InferenceRequest, max_in_flight=512, raw=True),
        Reads(
            "results", (t.RESULTS,), m.InferenceResult, group="results", max_in_flight=256, raw=True, notes="the cache"
        ),
        # tombstones remove a model, an experiment, a tenant's budget state
        Reads("models", (t.MODELS,), m.ModelSpec, group=None, raw=True),
        Reads("experiments", (t.EXPERIMENTS,), m.Experiment, group=None, raw=True),
        Reads("budgets", (t.BUDGETS,), m.BudgetStatus, group=None, raw=True),
        RESULT_LOOKUP,
    ),
    writes=(Writes(t.ROUTED, m.RoutedRequest), Writes(t.RESULTS, m.InferenceResult), *_replies(), DLQ),
)
# A cut answer's chunks read back by request id: by its next worker, to continue it; by the scheduler, before a
# max_attempts error, to count its legs (llmbus.bus.read_back).
REPLY_LOOKUP = Reads(
    "replies",
    REPLY_TOPICS,
    m.TokenChunk,
    group=None,
    on_demand=True,
    notes="a cut answer's chunks, read back to continue it or count its legs (docs/delivery.md)",
)

SCHEDULER = Contract(
    t.SCHEDULER,
    reads=(
        Reads("routed", (t.ROUTED,), m.RoutedRequest, max_in_flight=10_000, raw=True, notes="held: placed or waiting"),
        # Outcomes are handled concurrently: their claims' releases share Redis round trips, and the
        # core sees them one at a time under the handlers' lock in any order (it holds one placement
        # per request and ignores an outcome of any other attempt; a release is of that attempt's key).
        Reads("outcomes", (t.OUTCOMES,), m.DispatchOutcome, group="outcomes.<instance>", max_in_flight=256, raw=True),
        # The fleet, followed by one consumer. Its records (heartbeats above all) are taken as they
        # arrive, each then waiting its turn for the handlers' lock. One at a time, llm.workers was read
        # only as fast as that lock came round: behind hundreds of outcome and routed handlers after a
        # leader failover (the 3-broker `leader_sigkill` scenario at load 16-22), its lag grew to 128
        # heartbeats, a live worker went unheard past its heartbeat timeout, and its 256 running
        # requests were placed again. The lock is FIFO and a heartbeat's handler awaits nothing before
        # it, so one worker's statuses still apply in order.
        Reads("workers", (t.WORKERS,), m.WorkerStatus, group=None, max_in_flight=64, raw=True),
        Reads("nodes", (t.NODES,), m.NodeProfile, group=None, max_in_flight=64, raw=True),
        Reads("models", (t.MODELS,), m.ModelSpec, group=None, max_in_flight=64, raw=True),
        Reads("control", (t.CONTROL,), m.Control, group=None, max_in_flight=64, raw=True),
        RESULT_LOOKUP,
        REPLY_LOOKUP,
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
        Reads("dispatch", (t.DISPATCH_SPEC.name,), m.Dispatch, group="<worker_id>", max_in_flight=256, raw=True),
        # its own group, from the log's end: a cancel or drain sent before it was ready is not its
        Reads(
            "control",
            (t.CONTROL,),
            m.Control,
            group="<worker_id>.control",
            from_earliest=False,
            max_in_flight=16,
            raw=True,
        ),
        Reads("models", (t.MODELS,), m.ModelSpec, group=None, at_start=True, notes="read once at start, as a table"),
        RESULT_LOOKUP,
        REPLY_LOOKUP,
        Reads(
            "nodes",
            (t.NODES,),
            m.NodeProfile,
            group=None,
            at_start=True,
            notes="its node agent's profile of its node, as a table at start and at each re-profile",
        ),
    ),
    writes=(
        Writes(t.RESULTS, m.InferenceResult),
        Writes(t.OUTCOMES, m.DispatchOutcome),
        Writes(t.WORKERS, m.WorkerStatus),
        Writes(t.NODES, m.NodeProfile, "only where no node agent speaks for its node"),
        *_replies(),
        DLQ,
    ),
)

GATEWAY = Contract(
    t.GATEWAY,
    reads=(
        Reads("replies", (t.REPLIES_SPEC.name,), m.TokenChunk, group=None, from_earliest=False, notes="its own"),
        # the catalog of GET /v1/models, followed (tombstones of collected workers change nothing)
        Reads("workers", (t.WORKERS,), m.WorkerStatus, group=None, raw=True),
        Reads("models", (t.MODELS,), m.ModelSpec, group=None, raw=True),
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
        Reads("nodes", (t.NODES,), m.NodeProfile, group=None, notes="llmbus status --nodes"),
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

NODE_AGENT = Contract(
    t.NODE_AGENT,
    writes=(Writes(t.NODES, m.NodeProfile, "its node's profile and health, every interval"),),
)

SERVICES: tuple[Contract, ...] = (
    ROUTER,
    SCHEDULER,
    WORKER,
    COMPARATOR,
    AUTOSCALER,
    COST,
    GATEWAY,
    ARCHIVE,
    NODE_AGENT,
)
ALL: tuple[Contract, ...] = (*SERVICES, CLIENT, ANALYTICS)
BY_SERVICE = {contract.service: contract for contract in ALL}


def writers_of(topic: str) -> tuple[str, ...]:
    """The roles that declare writing `topic` (a catalog name), in catalog order of services."""
    return tuple(c.service for c in ALL if topic in c.write_topics())


def readers_of(topic: str) -> tuple[str, ...]:
    return tuple(c.service for c in ALL if topic in c.read_topics())
