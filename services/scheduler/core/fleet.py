"""The fleet as the scheduler sees it: heartbeats plus its own placed-not-finished requests.

Placement never waits for a heartbeat: every placement is counted against the worker at
once (requests, KV blocks) and released when its DispatchOutcome arrives. Heartbeats
refresh the gauges and the liveness clock. After a restart the fleet is rebuilt from the
compacted llm.workers / llm.nodes topics and the placements persisted in Redis
(`services/scheduler/adapters/store.py`), through `restore`.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmbus.contract.messages import NodeProfile, WorkerState, WorkerStatus
from llmbus.contract.request_key import RequestKey
from llmbus_services.scheduler.core.types import Placement, SchedRequest, WorkerView, blocks_for

# A node agent's profile older than this, by a worker's probe of the same node, no longer speaks for the node.
AGENT_SILENT_MS = 10 * 60_000


class FleetView:
    def __init__(self, prefill_tokens_per_s: float = 50_000.0) -> None:
        self.prefill_tokens_per_ms = prefill_tokens_per_s / 1000
        self.workers: dict[str, WorkerView] = {}
        self._node_cc: dict[str, str] = {}  # node id → compute capability of its first GPU
        self.nodes: dict[str, NodeProfile] = {}  # node id → its latest profile
        self._by_request: dict[RequestKey, Placement] = {}  # request → its live placement
        self.newest_heartbeat_ms = 0  # receive time of the newest heartbeat read from any worker

    # -- inputs -------------------------------------------------------------------------
    def on_heartbeat(self, status: WorkerStatus, now_ms: int, replayed: bool = False) -> WorkerView:
        view = self.workers.get(status.worker_id)
        if view is None:
            view = self.workers[status.worker_id] = WorkerView(worker_id=status.worker_id)
        view.node_id = status.node_id
        view.dispatch_topic = status.dispatch_topic
        view.state = status.state
        view.models = list(status.models)
        view.model_version = status.model_version
        view.engine = status.engine
        view.engine_features = status.engine_features
        view.model_format = status.model_format
        view.formats_supported = list(status.formats_supported)
        view.compute_capability = self._node_cc.get(status.node_id)
        if (node := self.nodes.get(status.node_id)) is not None:
            _node_facts(view, node)
        view.max_loras = status.max_loras
        view.max_lora_rank = status.max_lora_rank
        view.lora_adapters_reported = list(status.lora_adapters)
        # What it listed covers what we placed before it wrote the heartbeat.
        view.adapters_placed_ms = {a: at for a, at in view.adapters_placed_ms.items() if at >= status.sent_at_ms}
        view.max_model_len = status.max_model_len
        view.max_num_seqs = status.max_num_seqs
        view.kv_block_size = status.kv_block_size
        view.kv_blocks_total = status.kv_blocks_total
        view.kv_offload_blocks_total = status.kv_offload_blocks_total
        view.kv_blocks_free_reported = status.kv_blocks_free
        view.num_requests_running_reported = status.num_requests_running
        view.num_requests_waiting_reported = status.num_requests_waiting
        view.prefill_backlog_tokens_reported = status.prefill_backlog_tokens
        view.gpu_healthy = status.gpu_healthy
        view.ecc_uncorrected = status.ecc_uncorrected
        # The receive time, on our clock: a worker whose clock runs behind is judged by when we
        # last heard from it, not by its own stamps. Only heartbeats replayed from the compacted
        # topic at startup (written before we started) keep their send time: a long-dead worker
        # must not look alive because we read its last words just now.
        view.last_heartbeat_ms = min(now_ms, status.sent_at_ms) if replayed else now_ms
        self.newest_heartbeat_ms = max(self.newest_heartbeat_ms, view.last_heartbeat_ms)
        view.prompt_tokens_per_ms_reported = status.prompt_tokens_per_s / 1000
        if status.num_requests_waiting == 0 and status.num_requests_running == 0:
            # The engine was idle when it wrote this: only what we placed since can be queued.
            since = sum(p.uncached_tokens_est for p in view.inflight.values() if p.placed_at_ms >= status.sent_at_ms)
            view.clamp_backlog(now_ms, self.prefill_tokens_per_ms, since)
        view.heartbeat_sent_at_ms = status.sent_at_ms
        view.started_at_ms = max(view.started_at_ms, status.started_at_ms)
        return view

    def placed_before(self, worker_id: str, at_ms: int) -> list[Placement]:
        """The worker's placements made before `at_ms`, released here (the process they went to is gone)."""
        view = self.workers.get(worker_id)
        if view is None:
            return []
        gone = [p for p in view.inflight.values() if p.placed_at_ms < at_ms]
        return [p for p in gone if self.finish(p.request_key, p.attempt) is not None]

    def on_node(self, profile: NodeProfile) -> None:
        known = self.nodes.get(profile.node_id)
        agent_speaks = known is not None and known.source == "agent" and profile.source == "worker"
        if known is not None and agent_speaks and profile.profiled_at_ms - known.profiled_at_ms < AGENT_SILENT_MS:
            return  # the node agent speaks for its node; a worker's own probe does not override it
        self.nodes[profile.node_id] = profile
        if profile.gpus:
            self._node_cc[profile.node_id] = profile.gpus[0].compute_capability
        for view in self.workers.values():
            if view.node_id == profile.node_id:
                if profile.gpus:
                    view.compute_capability = profile.gpus[0].compute_capability
                _node_facts(view, profile)

    def remove_worker(self, worker_id: str) -> list[Placement]:
        """Forget a worker; returns what it held so recovery can place it again."""
        view = self.workers.pop(worker_id, None)
        if view is None:
            return []
        for placement in view.inflight.values():
            self._by_request.pop(placement.request_key, None)
        return list(view.inflight.values())

    # -- placements ---------------------------------------------------------------------
    def place(
        self, request: SchedRequest, worker_id: str, now_ms: int, uncached_tokens_est: int | None = None
    ) -> Placement:
        view = self.workers[worker_id]
        uncached = request.prompt_tokens if uncached_tokens_est is None else uncached_tokens_est
        view.prefill_backlog_tokens = view.prefill_backlog_at(now_ms, self.prefill_tokens_per_ms) + uncached
        view.backlog_at_ms = now_ms
        placement = Placement(
            request_id=request.request_id,
            attempt=request.attempt,
            worker_id=worker_id,
            model=request.model,
            kv_blocks=blocks_for(request.tokens_on(view.max_model_len), view.kv_block_size),
            placed_at_ms=now_ms,
            request=request,
            uncached_tokens_est=uncached,
        )
        view.inflight[placement.key] = placement
        self._by_request[request.key] = placement
        if request.adapter is not None:
            view.adapters_placed_ms[request.adapter.name] = now_ms
        return placement

    def restore(self, placements: Iterable[Placement]) -> None:
        """Re-count placements loaded after a restart (a worker not yet heard from gets a stub view)."""
        for placement in placements:
            view = self.workers.get(placement.worker_id)
            if view is None:
                # Heard of only through our own records: not ready until it heartbeats, and
                # declared dead if it does not within the timeout (see dead_workers).
                view = self.workers[placement.worker_id] = WorkerView(
                    worker_id=placement.worker_id,
                    state=WorkerState.STARTING,
                )
            view.inflight[placement.key] = placement
            self._by_request[placement.request_key] = placement

    def finish(self, key: RequestKey, attempt: int, now_ms: int | None = None) -> Placement | None:
        """Release a placement when its outcome arrives; None for an unknown or stale attempt."""
        placement = self._by_request.get(key)
        if placement is None or placement.attempt != attempt:
            return None
        del self._by_request[key]
        view = self.workers.get(placement.worker_id)
        if view is not None:
            view.inflight.pop(placement.key, None)
            # Whatever prefill is still queued belongs to the requests that have not finished.
            left = sum(p.uncached_tokens_est for p in view.inflight.values())
            view.clamp_backlog(now_ms if now_ms is not None else view.backlog_at_ms, self.prefill_tokens_per_ms, left)
        return placement

    def cool_down(self, worker_id: str, until_ms: int) -> None:
        view = self.workers.get(worker_id)
        if view is not None:
            view.cooldown_until_ms = max(view.cooldown_until_ms, until_ms)

    def placement_of(self, key: RequestKey) -> Placement | None:
        return self._by_request.get(key)

    # -- queries ------------------------------------------------------------------------
    def heard(
        self, w: WorkerView, now_ms: int, heartbeat_timeout_ms: int, watching_since_ms: int = 0, lag_cap_factor: int = 6
    ) -> bool:
        """The one liveness rule (placement, "nobody serves the model", pool statistics, dead workers):
        heard within the timeout, or silent no longer than every other worker (the heartbeat stream
        itself is late: this process behind on llm.workers, or its partition's leader failing over
        to another broker) and for at most `lag_cap_factor` timeouts. Silence counts from when we
        started watching (after a restart every worker gets a full timeout to be heard)."""
        silent_ms = now_ms - max(w.last_heartbeat_ms, watching_since_ms)
        if silent_ms <= heartbeat_timeout_ms:
            return True
        behind_others_ms = self.newest_heartbeat_ms - w.last_heartbeat_ms
        return behind_others_ms <= heartbeat_timeout_ms and silent_ms <= lag_cap_factor * heartbeat_timeout_ms

    def dead_workers(self, now_ms: int, heartbeat_timeout_ms: int, watching_since_ms: int = 0) -> list[str]:
        """Workers not `heard`: silent past the timeout while others were heard, or past the lag cap.

        When this process falls behind on llm.workers every worker looks silent, and declaring them
        all dead would place their running requests twice; past the lag cap a worker is dead
        regardless, so a fleet that died all at once still has its requests placed again.
        """
        return [
            w.worker_id
            for w in self.workers.values()
            if w.state != WorkerState.STOPPED and not self.heard(w, now_ms, heartbeat_timeout_ms, watching_since_ms)
        ]

    def stopped_workers(self) -> list[str]:
        return [w.worker_id for w in self.workers.values() if w.state == WorkerState.STOPPED]

    def serving(self, model: str) -> list[WorkerView]:
        return [w for w in self.workers.values() if w.serves(model)]


def _node_facts(view: WorkerView, node: NodeProfile) -> None:
    view.hardware_class = node.hardware_class
    view.cpu_count = node.cpu_count
    view.node_health = node.health
