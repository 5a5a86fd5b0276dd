"""/metrics gauges of the worker, with vLLM's metric stems where the meaning is the same."""

from __future__ import annotations

from prometheus_client import Gauge

from llmbus.contract.messages import WorkerStatus

LABELS = ["worker_id", "model_name"]

NUM_REQUESTS_RUNNING = Gauge("llmbus_worker_num_requests_running", "Requests in the engine's running batch", LABELS)
NUM_REQUESTS_WAITING = Gauge("llmbus_worker_num_requests_waiting", "Requests waiting in the engine", LABELS)
KV_CACHE_USAGE_PERC = Gauge("llmbus_worker_kv_cache_usage_perc", "KV-cache usage, 1 = full", LABELS)
PREFIX_CACHE_HIT_RATE = Gauge("llmbus_worker_prefix_cache_hit_rate", "Prefix cache hits / queries (tokens)", LABELS)
GENERATION_TOKENS_PER_S = Gauge("llmbus_worker_generation_tokens_per_second", "Output tokens per second", LABELS)
COLD_START_SECONDS = Gauge("llmbus_worker_cold_start_seconds", "Process start to ready", LABELS)
READY = Gauge("llmbus_worker_ready", "1 when the worker takes work", LABELS)


def export(status: WorkerStatus) -> None:
    labels = (status.worker_id, status.models[0] if status.models else "")
    NUM_REQUESTS_RUNNING.labels(*labels).set(status.num_requests_running)
    NUM_REQUESTS_WAITING.labels(*labels).set(status.num_requests_waiting)
    KV_CACHE_USAGE_PERC.labels(*labels).set(status.kv_cache_usage_perc)
    PREFIX_CACHE_HIT_RATE.labels(*labels).set(status.prefix_cache_hit_rate)
    GENERATION_TOKENS_PER_S.labels(*labels).set(status.generation_tokens_per_s)
    if status.cold_start_s is not None:
        COLD_START_SECONDS.labels(*labels).set(status.cold_start_s)
    READY.labels(*labels).set(1 if status.state == "ready" else 0)
