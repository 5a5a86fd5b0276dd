"""vLLM's own numbers for the worker: a StatLoggerBase passed to AsyncLLM as `stat_loggers`.

It receives each engine step's SchedulerStats (running / waiting, KV usage, prefix cache queries /
hits) and IterationStats (prompt / generation tokens, preemptions), the same numbers vLLM's own
Prometheus logger exports, and keeps the latest gauges and running counters.
"""

from __future__ import annotations

import time
from typing import Any


class StatsSink:
    """Latest scheduler gauges and running counters, written by the stat logger on every engine step."""

    def __init__(self) -> None:
        self.num_running = 0
        self.num_waiting = 0
        self.kv_cache_usage = 0.0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.external_prefix_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.updated_at = 0.0

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            self.num_running = scheduler_stats.num_running_reqs
            self.num_waiting = scheduler_stats.num_waiting_reqs + getattr(
                scheduler_stats, "num_skipped_waiting_reqs", 0
            )
            self.kv_cache_usage = scheduler_stats.kv_cache_usage
            pcs = scheduler_stats.prefix_cache_stats
            if pcs is not None:
                self.prefix_queries += pcs.queries
                self.prefix_hits += pcs.hits
            ext = scheduler_stats.connector_prefix_cache_stats  # KV offloading / connector hits
            if ext is not None:
                self.external_prefix_hits += ext.hits
        if iteration_stats is not None:
            self.prompt_tokens += iteration_stats.num_prompt_tokens
            self.generation_tokens += iteration_stats.num_generation_tokens
            self.preemptions += iteration_stats.num_preempted_reqs
        self.updated_at = time.monotonic()


def stat_logger_factory(sink: StatsSink) -> Any:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _SinkLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):  # type: ignore[no-untyped-def]
            sink.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            return None

    return _SinkLogger
