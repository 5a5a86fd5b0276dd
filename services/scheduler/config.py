"""Scheduler settings (env prefix LLMBUS_SCHEDULER_)."""

from __future__ import annotations

import os
import socket

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class SchedulerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_SCHEDULER_", extra="ignore")

    # Names this process in claims and its own outcomes consumer group. Keep it stable across
    # restarts (e.g. the pod name) so a restarted instance resumes its outcomes where it stopped.
    instance_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    pipeline: str = "default"  # services/scheduler/policies/<name>.yaml, or a path to a YAML file
    max_in_flight: int = 10_000  # routed requests held (placed or waiting) at once
    max_attempts: int = 3
    heartbeat_stale_s: float = 5.0  # a worker silent this long is dead: its requests are placed again
    no_worker_timeout_s: float = 60.0  # longest queue wait of a request without a deadline
    max_queued_per_model: int = 1_000  # beyond this a request is refused with QUEUE_FULL
    # One tenant's waiting requests over all models: a flood from one tenant cannot take the
    # routed slots (max_in_flight) and the queues from everyone else. None: no tenant bound.
    max_queued_per_tenant: int | None = 500
    tick_ms: int = 200  # how often deadlines and worker liveness are checked
    prefix_block_tokens: int = 16
    max_prefix_blocks: int = 512  # prefix hashes per request (the first 8k tokens at 16 per block)
    prefill_tokens_per_s: float = 50_000.0  # one worker's prefill rate, for the TTFT estimate
    placement_ttl_s: int = 24 * 3600  # a claim whose outcome never comes expires (bounded Redis keys)
    seed: int | None = None
    pool_stats_interval_s: float = 5.0  # how often per-pool statistics go to llm.pool-stats
    # A pool (a model name, which clients choose) idle this long is no longer reported or kept.
    pool_stats_forget_after_s: float = 900.0
    # TTFT and time per output token in the pool statistics are over this sliding window of finished requests.
    pool_stats_latency_window_s: float = Field(default=60.0, gt=0)
    # Pools of models this scheduler does not know (not in the fleet or the registry) reported per
    # interval: the busiest ones; the rest are still queued and placed, only not reported.
    pool_stats_max_unknown_pools: int = Field(default=32, ge=0)
