"""/metrics gauges of the worker, with vLLM's metric stems where the meaning is the same."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from llmbus.contract.messages import WorkerStatus

LABELS = ["worker_id", "model_name"]

NUM_REQUESTS_RUNNING = Gauge("llmbus_worker_num_requests_running", "Requests in the engine's running batch", LABELS)
NUM_REQUESTS_WAITING = Gauge("llmbus_worker_num_requests_waiting", "Requests waiting in the engine", LABELS)
PREFILL_BACKLOG_TOKENS = Gauge(
    "llmbus_worker_prefill_backlog_tokens", "Prompt tokens admitted and not yet prefilled", LABELS
)
KV_CACHE_USAGE_PERC = Gauge("llmbus_worker_kv_cache_usage_perc", "KV-cache usage, 1 = full", LABELS)
PREFIX_CACHE_HIT_RATE = Gauge("llmbus_worker_prefix_cache_hit_rate", "Prefix cache hits / queries (tokens)", LABELS)
GENERATION_TOKENS_PER_S = Gauge("llmbus_worker_generation_tokens_per_second", "Output tokens per second", LABELS)
COLD_START_SECONDS = Gauge("llmbus_worker_cold_start_seconds", "Process start to ready", LABELS)
READY = Gauge("llmbus_worker_ready", "1 when the worker takes work", LABELS)
# Continuations (docs/delivery.md, "Continuation across legs"), by why the leg before ended:
# worker_lost, drained, engine_oom, engine_failed, upstream_failed, failed.
CONTINUATIONS = Counter(
    "llmbus_worker_continuations_total", "Answers this worker continued from where a cut leg left them", ["cause"]
)
# Answers cut mid-stream that this worker started again instead (tool calls, n > 1, a gap in the chunks, an
# engine that cannot continue) or ended (migration_limit), by that reason.
CONTINUATIONS_REFUSED = Counter(
    "llmbus_worker_continuations_refused_total", "Cut answers restarted or ended instead of continued", ["reason"]
)
CONTINUATION_READ_SECONDS = Histogram(
    "llmbus_worker_continuation_read_seconds",
    "Reading a cut answer back from its reply topic",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


def export(status: WorkerStatus) -> None:
    labels = (status.worker_id, status.models[0] if status.models else "")
    NUM_REQUESTS_RUNNING.labels(*labels).set(status.num_requests_running)
    NUM_REQUESTS_WAITING.labels(*labels).set(status.num_requests_waiting)
    PREFILL_BACKLOG_TOKENS.labels(*labels).set(status.prefill_backlog_tokens)
    KV_CACHE_USAGE_PERC.labels(*labels).set(status.kv_cache_usage_perc)
    PREFIX_CACHE_HIT_RATE.labels(*labels).set(status.prefix_cache_hit_rate)
    GENERATION_TOKENS_PER_S.labels(*labels).set(status.generation_tokens_per_s)
    if status.cold_start_s is not None:
        COLD_START_SECONDS.labels(*labels).set(status.cold_start_s)
    READY.labels(*labels).set(1 if status.state == "ready" else 0)
