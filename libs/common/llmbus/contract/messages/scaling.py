"""Pool statistics: the scheduler's per-pool scaling signal (the autoscaler reads it)."""

from __future__ import annotations

from pydantic import Field

from llmbus.contract.messages.base import Message, now_ms
from llmbus.contract.messages.release import ReleaseContext


class PoolStats(Message):
    """On llm.pool-stats (key: pool = model name), every few seconds from each scheduler instance.

    Counts are over the window [window_start_ms, sent_at_ms); gauges are the state at sent_at_ms.
    Queue wait is routed → placed on a worker: the scheduler places a request only when a
    worker has a free batch slot and KV room, so placement is when the worker starts it.
    What a request waits inside the engine (behind other prompts' prefill) is not queue wait:
    the latency fields (TTFT, time per output token, over the last `latency_window_s`) and the
    prefill backlog (from the workers' heartbeats) see it.
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
    kv_cache_usage_perc_max: float = Field(default=0.0, ge=0.0, le=1.0, description="the fullest ready worker's")
    # Latency seen by the requests, as their results report it (received → first token; the mean time
    # per output token after the first), over a sliding window so one quiet 5 s does not blank it.
    latency_window_s: float = Field(default=0.0, ge=0.0, description="the window of the ttft_* and tpot_* fields")
    ttft_samples: int = Field(default=0, ge=0, description="first attempts finished in the latency window")
    ttft_ms_p50: float | None = Field(default=None, description="None: nothing finished in the latency window")
    ttft_ms_p90: float | None = None
    ttft_ms_p99: float | None = None
    tpot_ms_p50: float | None = None
    tpot_ms_p99: float | None = None
    # Work in the engines, in tokens: what TTFT will pay before it shows in the latency window.
    prefill_backlog_tokens: int = Field(
        default=0,
        ge=0,
        description="prompt tokens admitted to the pool's engines and not yet prefilled: the workers' own"
        " counts (heartbeats) plus the uncached prompt tokens placed since each heartbeat was sent",
    )
    arrival_prompt_tokens: int = Field(default=0, ge=0, description="prompt tokens of the window's arrivals")
    completion_tokens: int = Field(default=0, ge=0, description="output tokens of the window's completions")
    sent_at_ms: int = Field(default_factory=now_ms)
    release: ReleaseContext | None = Field(default=None, description="The pool's model's release (llm.models).")
