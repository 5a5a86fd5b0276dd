"""Values the policy works on: a request to place, a placement, and one worker as the scheduler sees it."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmbus.contract.messages import EarlierAttempt, LoraAdapter, NodeHealth, RoutedRequest, WorkerState
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
    model_version: str | None = None  # its release's version: only workers of that version take it
    session_id: str | None = None
    priority: int = 0  # 0 = most urgent
    deadline_ms: int | None = None
    arrived_at_ms: int = 0
    attempt: int = 1
    prefix_block_hashes: list[str] = field(default_factory=list)
    excluded_workers: set[str] = field(default_factory=set)  # workers that failed it
    # Its attempts before this one: where each ran and how it ended (the Dispatch tells the worker, which
    # names the legs of a continued answer with them).
    earlier: list[EarlierAttempt] = field(default_factory=list)
    not_before_ms: int = 0  # a retry after an upstream 429/503 waits (backoff) before it is placed again
    # After an OOM: its one retry goes only to a worker with more free KV blocks than the one that failed it had.
    oom_retries: int = 0
    kv_blocks_free_over: int | None = None
    # Its attempts whose text the answer so far continues (its legs): bounded by the answer's migration_limit,
    # not counted toward max_attempts (docs/delivery.md, "What counts toward max_attempts").
    legs_forgiven: int = 0
    routed: RoutedRequest | None = None  # what a Dispatch carries; None in pure tests and benches
    engine_features: frozenset[str] = frozenset()  # what its engine must honour (JSON, tools, suffix)
    adapter: LoraAdapter | None = None  # a LoRA adapter of `model` (then the base model) that its worker loads
    tier: str | None = None  # the routed model's tier: its latency target (capability filter)
    # The client set no max_tokens: the answer may take what the window leaves (the worker bounds it to its
    # own window), so a worker fits it when the prompt leaves room for one token (vllm serve's rule).
    max_tokens_auto: bool = False

    @property
    def key(self) -> RequestKey:
        """What the scheduler holds it by: two tenants may send one request id."""
        return request_key(self.tenant, self.request_id)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens

    @property
    def attempts_here(self) -> int:
        """Its attempts under the model it is routed to now (a fallback numbers on from the earlier model's)."""
        return self.attempt - (self.routed.attempts_before if self.routed is not None else 0)

    def tokens_on(self, max_model_len: int) -> int:
        """Prompt and answer on a worker of this window (0: unknown): an unset max_tokens takes what the
        window leaves (at least one token), a set one is what the client asked for."""
        if not self.max_tokens_auto or max_model_len <= 0:
            return self.total_tokens
        return self.prompt_tokens + max(1, min(self.max_tokens, max_model_len - self.prompt_tokens))

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
        adapter = routed.adapter
        return cls(
            request_id=req.request_id,
            model=routed.placement_model,
            # its release's version, of the model its workers serve: an adapter's release names the adapter's
            # version, and any version of its base that loads adapters serves it
            model_version=routed.release.model_version if routed.release is not None and adapter is None else None,
            prompt_tokens=prompt_tokens,
            max_tokens=req.max_tokens,
            tenant=req.tenant,
            session_id=req.session_id,
            priority=req.priority,
            deadline_ms=req.deadline_ms,
            arrived_at_ms=arrived_at_ms,
            attempt=routed.attempts_before + 1,
            # Salted per tenant (or cache group), and apart per LoRA adapter (its KV is not its base model's):
            # affinity follows only prefixes the worker caches for this tenant and adapter.
            prefix_block_hashes=prefix_block_hashes(
                text, prefix_block_tokens, max_prefix_blocks, routed.cache_salt, adapter.name if adapter else None
            ),
            routed=routed,
            engine_features=frozenset(req.engine_features()),
            max_tokens_auto=bool(req.max_tokens_auto),
            adapter=adapter,
            tier=routed.tier,
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
    model_version: str | None = None  # the registry version it serves
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
    prefill_backlog_tokens_reported: int = 0  # the engine's own count when it sent its last heartbeat
    gpu_healthy: bool = True
    ecc_uncorrected: int = 0
    last_heartbeat_ms: int = 0  # when we received it (our clock): a worker's own clock may be off
    heartbeat_sent_at_ms: int = 0
    started_at_ms: int = 0  # when its process started (its clock): a later one is the id restarted
    cooldown_until_ms: int = 0  # upstream said 429/503 (Retry-After): nothing new until then
    inflight: dict[str, Placement] = field(default_factory=dict)  # placement key → placement
    # Prefill work placed here and not yet done, as a fluid queue drained at the fleet's
    # prefill rate: TTFT is mostly the wait behind other prompts' prefill.
    prefill_backlog_tokens: float = 0.0
    backlog_at_ms: int = 0

    prompt_tokens_per_ms_reported: float = 0.0
    # LoRA: the engine's adapter slots and the adapters its last heartbeat listed (least recently used first);
    # adapters placed since count as loaded too (the worker loads one when its request arrives).
    max_loras: int = 0
    max_lora_rank: int = 0
    lora_adapters_reported: list[str] = field(default_factory=list)
    adapters_placed_ms: dict[str, int] = field(default_factory=dict)  # adapter → when we last placed it here
    # The node, from its NodeProfile (the node agent's, else a worker's probe): placement by capability and health.
    hardware_class: str | None = None
    cpu_count: int = 0
    node_health: NodeHealth = NodeHealth.OK

    def adapters_loaded_est(self) -> list[str]:
        """The adapters in its slots now, least recently used first: the heartbeat's list, then what we placed
        since it was sent, the oldest dropped beyond `max_loras` (the engine evicts its least recently used)."""
        since = sorted(
            (at_ms, name) for name, at_ms in self.adapters_placed_ms.items() if at_ms >= self.heartbeat_sent_at_ms
        )
        recent = [name for _, name in since]
        loaded = [name for name in self.lora_adapters_reported if name not in recent] + recent
        return loaded[-self.max_loras :] if self.max_loras > 0 else []

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
    def prefill_backlog_tokens_est(self) -> int:
        """The engine's reported backlog plus the uncached prompt tokens placed here since that report."""
        since = sum(
            p.uncached_tokens_est for p in self.inflight.values() if p.placed_at_ms >= self.heartbeat_sent_at_ms
        )
        return self.prefill_backlog_tokens_reported + since

    @property
    def kv_blocks_free_est(self) -> int:
        return max(0, self.kv_blocks_free_reported - self.blocks_placed_since_heartbeat)

    @property
    def load(self) -> int:
        """Requests on the worker: our own count, or the heartbeat's when it knows of more."""
        reported = self.num_requests_running_reported + self.num_requests_waiting_reported
        return max(self.inflight_count, reported)

    def serves(self, model: str, version: str | None = None) -> bool:
        """Serves `model`, and `version` of it when one is asked for (a request of a release)."""
        return model in self.models and (version is None or version == self.model_version)
