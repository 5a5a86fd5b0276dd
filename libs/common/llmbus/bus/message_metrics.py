"""Prometheus series read off the messages a service publishes (pure counting, no handler code).

Every final result, routing decision and dispatch goes through `Publisher.publish`, so the
user-experience and quality series come from one place in every process: results by status
and error code, time to first token, end-to-end time, queue time, tokens, preemptions, cache
hits (from each InferenceResult); routes by rule, variant and shadow, fallbacks (RoutedRequest);
first attempts and retries, queue wait per model pool (Dispatch); session turns by outcome
(results with a session id), feedback scores (Feedback, published by the gateway), shadow
similarity and agreement (Comparison, published by the comparator); results of registry models by
version, release (upgrade id) and stage, and their latency by version. Names keep vLLM's stems.

A model label is the model's name only where the process knows the model (llmbus.observability.
metric_children.MODEL_LABELS: its policy, the registry, the fleet; a worker's own heartbeats teach it
what it serves), else `other`: a client naming random models adds no series.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from llmbus.contract.messages import (
    Comparison,
    Dispatch,
    Feedback,
    FinishReason,
    Guardrails,
    InferenceResult,
    Message,
    ResultStatus,
    RoutedRequest,
    WorkerStatus,
)
from llmbus.observability.metric_children import MODEL_LABELS, children_of, model_label

_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
_UNIT_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # scores and similarities in [0, 1]

RESULTS = Counter(
    "llmbus_request_results_total",
    "Final results published, by status, error code and finish reason",
    ["service", "model", "status", "code", "finished_reason", "shadow"],
)
TTFT_SECONDS = Histogram(
    "llmbus_request_time_to_first_token_seconds",
    "Received by the router -> first token (from results)",
    ["model"],
    buckets=_LATENCY_BUCKETS_S,
)
E2E_SECONDS = Histogram(
    "llmbus_request_e2e_request_latency_seconds",
    "Received by the router -> final token (from results)",
    ["model"],
    buckets=_LATENCY_BUCKETS_S,
)
QUEUE_SECONDS = Histogram(
    "llmbus_request_queue_time_seconds",
    "Received by the router -> the engine started it (from results)",
    ["model"],
    buckets=_LATENCY_BUCKETS_S,
)
GENERATION_TOKENS = Counter("llmbus_request_generation_tokens_total", "Output tokens of finished requests", ["model"])
PROMPT_TOKENS = Counter("llmbus_request_prompt_tokens_total", "Prompt tokens of finished requests", ["model"])
CACHED_PROMPT_TOKENS = Counter(
    "llmbus_request_cached_prompt_tokens_total", "Prompt tokens served from a prefix cache", ["model"]
)
PREEMPTIONS = Counter("llmbus_request_preemptions_total", "Engine preemptions of finished requests", ["model"])
ROUTED = Counter(
    "llmbus_routed_total",
    "Routing decisions by rule (fallback hops count as rule 'fallback'), variant and shadow",
    ["model", "rule", "variant", "shadow"],
)
DISPATCHES = Counter("llmbus_dispatches_total", "Dispatches by worker; attempt > 1 is a retry", ["worker", "retry"])
SESSION_TURNS = Counter(
    "llmbus_session_turns_total",
    "Final results of requests with a session id (one per turn): completed = ok and not cut by a length limit",
    ["model", "outcome"],
)
FEEDBACK_SCORE = Histogram(
    "llmbus_feedback_score", "Feedback scores (POST /v1/feedback, 0..1) handed to the bus", buckets=_UNIT_BUCKETS
)
SIMILARITY = Histogram(
    "llmbus_comparison_similarity",
    "Shadow comparisons: the candidate's answer's similarity to the control's (ROUGE-L F1)",
    ["experiment"],
    buckets=_UNIT_BUCKETS,
)
COMPARISONS = Counter(
    "llmbus_comparisons_total",
    "Shadow comparisons by outcome: agree (similarity >= 0.5), disagree, failed (a side failed)",
    ["experiment", "outcome"],
)
VERSION_RESULTS = Counter(
    "llmbus_version_results_total",
    "Final results of registry models by version, release (upgrade id) and rollout stage",
    ["model", "version", "upgrade_id", "stage", "status", "shadow"],
)
VERSION_E2E_SECONDS = Histogram(
    "llmbus_version_e2e_request_latency_seconds",
    "Received by the router -> final token, by model version (from results of registry models)",
    ["model", "version"],
    buckets=_LATENCY_BUCKETS_S,
)
AGREEMENT_SIMILARITY: float = Guardrails.model_fields["min_similarity"].default  # the rollout guardrails' default

# Touched for every message published: each child is looked up once (llmbus.observability.metric_children).
_results = children_of(RESULTS)
_ttft_seconds = children_of(TTFT_SECONDS)
_e2e_seconds = children_of(E2E_SECONDS)
_queue_seconds = children_of(QUEUE_SECONDS)
_generation_tokens = children_of(GENERATION_TOKENS)
_prompt_tokens = children_of(PROMPT_TOKENS)
_cached_prompt_tokens = children_of(CACHED_PROMPT_TOKENS)
_preemptions = children_of(PREEMPTIONS)
_routed = children_of(ROUTED)
_dispatches = children_of(DISPATCHES)
_session_turns = children_of(SESSION_TURNS)
_similarity = children_of(SIMILARITY)
_comparisons = children_of(COMPARISONS)
_version_results = children_of(VERSION_RESULTS)
_version_e2e_seconds = children_of(VERSION_E2E_SECONDS)


def _rule(route_reason: str | None) -> str:
    reason = route_reason or "unknown"
    return "fallback" if reason.startswith("fallback:") else reason


def observe_published(service: str, value: Message) -> None:
    match value:
        case InferenceResult():
            _result(service, value)
        case RoutedRequest():
            _routed(
                model_label(value.model), _rule(value.route_reason), value.variant or "", str(value.shadow).lower()
            ).inc()
        case Dispatch():
            # Queue wait per pool is the scheduler's own histogram (services/scheduler/adapters/pool_stats.py).
            _dispatches(value.worker_id, str(value.attempt > 1).lower()).inc()
        case Feedback():
            FEEDBACK_SCORE.observe(value.score)
        case Comparison():
            _comparison(value)
        case WorkerStatus():
            MODEL_LABELS.learn(value.models)  # what this worker serves: its results' models


def turn_outcome(r: InferenceResult) -> str:
    """completed: answered in full; truncated: ok but cut at max_tokens or the window; failed: an error."""
    if r.status != ResultStatus.OK:
        return "failed"
    return "truncated" if r.finish_reason == FinishReason.LENGTH else "completed"


def comparison_outcome(c: Comparison) -> str:
    if c.similarity is None:
        return "failed"
    return "agree" if c.similarity >= AGREEMENT_SIMILARITY else "disagree"


def _comparison(c: Comparison) -> None:
    _comparisons(c.experiment_id, comparison_outcome(c)).inc()
    if c.similarity is not None:
        _similarity(c.experiment_id).observe(c.similarity)


def _result(service: str, r: InferenceResult) -> None:
    model = model_label(r.model)
    _results(
        service,
        model,
        str(r.status),
        str(r.error.code) if r.error else "",
        str(r.finish_reason or ""),
        str(r.shadow).lower(),
    ).inc()
    if r.timings.ttft_ms is not None:
        _ttft_seconds(model).observe(r.timings.ttft_ms / 1000)
    if r.timings.total_ms is not None:
        _e2e_seconds(model).observe(r.timings.total_ms / 1000)
    if r.timings.queued_ms is not None:
        _queue_seconds(model).observe(max(0.0, r.timings.queued_ms) / 1000)
    _generation_tokens(model).inc(r.usage.completion_tokens)
    _prompt_tokens(model).inc(r.usage.prompt_tokens)
    _cached_prompt_tokens(model).inc(r.usage.cached_prompt_tokens)
    _preemptions(model).inc(r.preemptions)
    if r.session_id and not r.shadow:
        _session_turns(model, turn_outcome(r)).inc()
    if (release := r.release) is not None:
        version = release.model_version
        stage = release.label()
        _version_results(model, version, release.upgrade_id, stage, str(r.status), str(r.shadow).lower()).inc()
        if r.timings.total_ms is not None:
            _version_e2e_seconds(model, version).observe(r.timings.total_ms / 1000)
