"""Scorers on load: fewer requests queued/running scores higher; less KV in use scores higher."""

from __future__ import annotations

from dataclasses import dataclass

from llmbus_services.scheduler.core.plugins.base import SCORERS, CycleState
from llmbus_services.scheduler.core.types import SchedRequest, WorkerView


@SCORERS.register("queue-depth")
@dataclass
class QueueDepthScorer:
    """1 for the least-loaded worker, 0 for the most loaded (min-max over the candidates).

    Load is our own placed-not-finished count (or the heartbeat's when it sees more), so
    two requests arriving between heartbeats do not both go to the same idle worker.
    """

    name: str = "queue-depth"

    def score(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> dict[str, float]:
        loads = {w.worker_id: w.load for w in workers}
        lo, hi = min(loads.values(), default=0), max(loads.values(), default=0)
        if hi == lo:
            return dict.fromkeys(loads, 1.0)
        return {wid: (hi - load) / (hi - lo) for wid, load in loads.items()}


@SCORERS.register("kv-usage")
@dataclass
class KvUsageScorer:
    """Free share of the KV cache after this request (estimated free blocks / total)."""

    name: str = "kv-usage"

    def score(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> dict[str, float]:
        out = {}
        for w in workers:
            if w.kv_blocks_total <= 0:
                out[w.worker_id] = 0.5  # unknown capacity: neither favour nor avoid
                continue
            out[w.worker_id] = min(1.0, max(0.0, w.kv_blocks_free_est / w.kv_blocks_total))
        return out


@SCORERS.register("prefill-backlog")
@dataclass
class PrefillBacklogScorer:
    """Estimated wait for the first token: prefill placed ahead on the worker plus this prompt's uncached part.

    The uncached part depends on the worker (its prefix-cache match), so this one score
    weighs load against affinity in the unit that matters for TTFT. 1 = shortest wait
    among the candidates, 0 = longest (min-max).
    """

    name: str = "prefill-backlog"

    def score(self, state: CycleState, request: SchedRequest, workers: list[WorkerView]) -> dict[str, float]:
        rate = state.fleet.prefill_tokens_per_ms
        waits = {
            w.worker_id: w.prefill_backlog_at(state.now_ms, rate) + state.uncached_tokens(request, w.worker_id)
            for w in workers
        }
        lo, hi = min(waits.values(), default=0.0), max(waits.values(), default=0.0)
        if hi - lo < 1e-9:
            return dict.fromkeys(waits, 1.0)
        return {wid: (hi - wait) / (hi - lo) for wid, wait in waits.items()}
