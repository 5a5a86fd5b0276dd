"""Pool statistics: the scheduler's per-pool scaling signal (the autoscaler reads it)."""

from __future__ import annotations

from pydantic import Field

from llmbus.contract.messages.base import Message, now_ms


class PoolStats(Message):
    """On llm.pool-stats (key: pool = model name), every few seconds from each scheduler instance.

    Counts are over the window [window_start_ms, sent_at_ms); gauges are the state at sent_at_ms.
    Queue wait is routed → placed on a worker: the scheduler places a request only when a
    worker has a free batch slot and KV room, so placement is when the worker starts it.
    """

    pool: str
    instance_id: str = ""
    window_start_ms: int
    window_s: float = Field(ge=0.0)
    arrivals: int = Field(default=0, ge=0, description="routed requests received in the window")
    placed: int = Field(default=0, ge=0, description="first attempts placed on a worker in the window")
    completed: int = Field(default=0, ge=0, description="attempts whose outcome came back in the window")
    queue_wait_ms_p50: float | None = Field(default=None, description="None: nothing placed in the window")
    queue_wait_ms_p90: float | None = None
    queue_wait_ms_p99: float | None = None
    queue_wait_ms_max: float | None = None
    service_ms_mean: float | None = Field(default=None, description="placed → outcome, mean over the window")
    queued: int = Field(default=0, ge=0, description="requests waiting for a worker now")
    oldest_wait_ms: float = Field(default=0.0, ge=0.0, description="age of the longest-waiting request now")
    in_flight: int = Field(default=0, ge=0, description="placed and not finished now")
    workers_ready: int = 0
    workers_warming: int = Field(default=0, description="starting or warming up")
    workers_draining: int = 0
    kv_cache_usage_perc_mean: float = 0.0
    sent_at_ms: int = Field(default_factory=now_ms)
