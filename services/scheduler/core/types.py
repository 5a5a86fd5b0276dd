"""Values the policy works on: a request to place, a placement, and one worker as the scheduler sees it."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmbus.contract.messages import RoutedRequest, WorkerState
from llmbus.contract.request_key import RequestKey, request_key
from llmbus.tokens import count_tokens, prefix_block_hashes


def blocks_for(tokens: int, block_size_tokens: int) -> int:
    return -(-tokens // max(1, block_size_tokens))


@dataclass
class SchedRequest:
    """One request waiting for a worker; `attempt` counts placements (1 = first)."""

    request_id: str
    model: str
    prompt_tokens: int
    max_tokens: int
    tenant: str = "default"
    session_id: str | None = None
    priority: int = 0  # 0 = most urgent
    deadline_ms: int | None = None
    arrived_at_ms: int = 0
    attempt: int = 1
    prefix_block_hashes: list[str] = field(default_factory=list)
    excluded_workers: set[str] = field(default_factory=set)  # workers that failed it
    not_before_ms: int = 0  # a retry after an upstream 429/503 waits (backoff) before it is placed again
    # After an OOM: its one retry goes only to a worker with more free KV blocks than the one that failed it had.
    oom_retries: int = 0
    kv_blocks_free_over: int | None = None
    routed: RoutedRequest | None = None  # what a Dispatch carries; None in pure tests and benches
    engine_features: frozenset[str] = frozenset()  # what its engine must honour (JSON, tools, suffix)

    @property
    def key(self) -> RequestKey:
        """What the scheduler holds it by: two tenants may send one request id."""
        return request_key(self.tenant, self.request_id)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens

    @classmethod
    def from_routed(
        cls,
        routed: RoutedRequest,
        arrived_at_ms: int,
        prefix_block_tokens: int = 16,
        max_prefix_blocks: int | None = 512,
        tokenizer: str | None = None,
    ) -> SchedRequest:
        """`tokenizer`: the model's (its ModelSpec's), for a request the router did not count."""
        req = routed.request
        text = req.prompt_text()
        prompt_tokens = routed.prompt_tokens_est or count_tokens(text, tokenizer)  # the router's count is kept
        return cls(
            request_id=req.request_id,
            model=routed.model,
            prompt_tokens=prompt_tokens,
            max_tokens=req.max_tokens,
            tenant=req.tenant,
            session_id=req.session_id,
            priority=req.priority,
            deadline_ms=req.deadline_ms,
            arrived_at_ms=arrived_at_ms,
            prefix_block_hashes=prefix_block_hashes(text, prefix_block_tokens, max_prefix_blocks),
            routed=routed,
            engine_features=frozenset(req.engine_features()),
        )


@dataclass
class Placement:
    """A request the scheduler put on a worker and has not yet seen finish."""

    request_id: str
    attempt: int
    worker_id: str
    model: str
    kv_blocks: int
    placed_at_ms: int
    request: SchedRequest
    uncached_tokens_est: int = 0  # prompt tokens the worker must compute (no prefix hit)

    @property
    def request_key(self) -> RequestKey:
        return self.request.key

    @property
    def key(self) -> str:
        return f"{self.request_key}:{self.attempt}"


@dataclass
class WorkerView:
    """One worker: its last heartbeat plus what this scheduler placed on it since."""

    worker_id: str
    node_id: str = ""
    dispatch_topic: str = ""
    state: WorkerState = WorkerState.READY
    models: list[str] = field(default_factory=list)
    engine: str = ""  # vllm | sim | openai-http: what it can honour (llmbus.contract.engine_features)
    engine_features: list[str] | None = None  # what it advertised it honours; None: its engine kind's
    model_format: str | None = None
    formats_supported: list[str] = field(default_factory=list)
    compute_capability: str | None = None  # from the node's NodeProfile (first GPU)
    max_model_len: int = 0
    max_num_seqs: int = 0
    kv_block_size: int = 16
    kv_blocks_total: int = 0
    kv_offload_blocks_total: int = 0  # a host-memory KV tier behind the GPU's (vLLM KV offloading)
    kv_blocks_free_reported: int = 0
    num_requests_running_reported: int = 0
    num_requests_waiting_reported: int = 0
    gpu_healthy: bool = True
    ecc_uncorrected: int = 0
    last_heartbeat_ms: int = 0  # when we received it (our clock): a worker's own clock may be off
    heartbeat_sent_at_ms: int = 0
    cooldown_until_ms: int = 0  # upstream said 429/503 (Retry-After): nothing new until then
    inflight: dict[str, Placement] = field(default_factory=dict)  # placement key → placement
    # Prefill work placed here and not yet done, as a fluid queue drained at the fleet's
    # prefill rate: TTFT is mostly the wait behind other prompts' prefill.
    prefill_backlog_tokens: float = 0.0
    backlog_at_ms: int = 0

    prompt_tokens_per_ms_reported: float = 0.0

    def prefill_backlog_at(self, now_ms: int, prefill_tokens_per_ms: float) -> float:
        # Drain at the configured rate or the rate the worker reports, whichever is faster: an
        # estimate that drains too slowly would keep a worker looking busy long after it is not.
        rate = max(prefill_tokens_per_ms, self.prompt_tokens_per_ms_reported)
        return max(0.0, self.prefill_backlog_tokens - rate * max(0, now_ms - self.backlog_at_ms))

    def clamp_backlog(self, now_ms: int, prefill_tokens_per_ms: float, ceiling_tokens: float) -> None:
        """Cap the estimate with what is known to be left (feedback from outcomes and heartbeats)."""
        self.prefill_backlog_tokens = min(self.prefill_backlog_at(now_ms, prefill_tokens_per_ms), ceiling_tokens)
        self.backlog_at_ms = now_ms

    @property
    def inflight_count(self) -> int:
        return len(self.inflight)

    @property
    def inflight_blocks(self) -> int:
        return sum(p.kv_blocks for p in self.inflight.values())

    @property
    def blocks_placed_since_heartbeat(self) -> int:
        # The heartbeat already counts what the worker had admitted when it was sent.
        return sum(p.kv_blocks for p in self.inflight.values() if p.placed_at_ms >= self.heartbeat_sent_at_ms)

    @property
    def kv_blocks_free_est(self) -> int:
        return max(0, self.kv_blocks_free_reported - self.blocks_placed_since_heartbeat)

    @property
    def load(self) -> int:
        """Requests on the worker: our own count, or the heartbeat's when it knows of more."""
        reported = self.num_requests_running_reported + self.num_requests_waiting_reported
        return max(self.inflight_count, reported)

    def serves(self, model: str) -> bool:
        return model in self.models
