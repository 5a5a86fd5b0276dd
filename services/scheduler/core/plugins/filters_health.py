"""Filters on a worker's health and room: GPU healthy, and the request fits length and free KV."""

from __future__ import annotations

from dataclasses import dataclass

from llmbus.contract.messages import NodeHealth, WorkerState
from llmbus_services.scheduler.core.plugins.base import FILTERS, CycleState
from llmbus_services.scheduler.core.types import SchedRequest, WorkerView, blocks_for


@FILTERS.register("gpu-healthy")
@dataclass
class GpuHealthyFilter:
    """Drops workers whose GPU reports unhealthy or more uncorrected ECC errors than allowed."""

    max_ecc_uncorrected: int = 0
    name: str = "gpu-healthy"

    def filter(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> list[WorkerView]:
        return [
            w
            for w in workers
            if w.gpu_healthy and w.state != WorkerState.UNHEALTHY and w.ecc_uncorrected <= self.max_ecc_uncorrected
        ]


@FILTERS.register("node-health")
@dataclass
class NodeHealthFilter:
    """The node's health as its node agent judges it (ECC counts over its thresholds): an unhealthy node gets no
    work; a degraded one is drained of high-priority work (priority <= `high_priority_at_most`, 0 the most
    urgent) and keeps the rest."""

    high_priority_at_most: int = 2
    name: str = "node-health"

    def filter(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> list[WorkerView]:
        urgent = request.priority <= self.high_priority_at_most
        return [
            w
            for w in workers
            if w.node_health != NodeHealth.UNHEALTHY and not (urgent and w.node_health == NodeHealth.DEGRADED)
        ]


@FILTERS.register("fits-capacity")
@dataclass
class FitsCapacityFilter:
    """prompt + max_tokens fit the worker's max model length, its free KV blocks and its batch.

    Free KV = last heartbeat's free blocks minus what we placed since it was sent, so a
    burst between heartbeats cannot overfill one worker. `kv_headroom` < 1 reserves room
    (vLLM preempts rather than fails when the estimate is off, so a little slack is safe).
    """

    kv_headroom: float = 1.0
    check_batch: bool = True
    name: str = "fits-capacity"

    def filter(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> list[WorkerView]:
        kept = []
        for w in workers:
            tokens = request.tokens_on(w.max_model_len)
            if w.max_model_len and tokens > w.max_model_len:
                continue
            if w.kv_blocks_total and blocks_for(tokens, w.kv_block_size) > (w.kv_blocks_free_est * self.kv_headroom):
                continue
            if self.check_batch and w.max_num_seqs and w.inflight_count >= w.max_num_seqs:
                continue
            kept.append(w)
        return kept


def never_fits(request: SchedRequest, workers: list[WorkerView]) -> bool:
    """True when no worker serving the model could ever take it: longer than every max length, or
    needing more KV blocks than any whole cache has (prompt and output must be in GPU memory at once)."""
    serving = [w for w in workers if w.serves(request.model, request.model_version) and w.max_model_len]
    return bool(serving) and all(
        (tokens := request.tokens_on(w.max_model_len)) > w.max_model_len
        or (w.kv_blocks_total > 0 and -(-tokens // w.kv_block_size) > w.kv_blocks_total)
        for w in serving
    )
