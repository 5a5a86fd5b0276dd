"""The scheduler's per-pool statistics: queue wait of placements, arrivals, in flight, workers."""

from __future__ import annotations

from prometheus_client import generate_latest

from llmbus.contract.messages import OutcomeStatus, WorkerState, WorkerStatus
from llmbus.contract.request_key import request_key
from llmbus_services.scheduler.adapters.pool_stats import ARRIVALS_TOTAL, PoolStatsRecorder
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.scheduler import PlaceAction, SchedulerCore
from llmbus_services.scheduler.core.types import SchedRequest


def status(worker_id: str, state: WorkerState, sent_at_ms: int) -> WorkerStatus:
    return WorkerStatus(
        worker_id=worker_id,
        node_id="n",
        state=state,
        engine="sim",
        models=["m"],
        max_model_len=4096,
        max_num_seqs=1,
        kv_blocks_total=1000,
        kv_blocks_free=1000,
        sent_at_ms=sent_at_ms,
    )


def test_pool_stats_window() -> None:
    core = SchedulerCore(Pipeline.load("default"))
    recorder = PoolStatsRecorder("i1")
    core.on_heartbeat(status("w1", WorkerState.READY, 1000), 1000)
    core.on_heartbeat(status("w2", WorkerState.WARMING, 1000), 1000)
    recorder.snapshot(core, 1000)  # window starts
    for i in range(3):  # one slot: the first is placed at once, the others wait
        recorder.on_arrival("m", 1100)
        actions = core.submit(SchedRequest(f"r{i}", "m", 10, 10, arrived_at_ms=1100), 1100)
        for a in actions:
            assert isinstance(a, PlaceAction)
            recorder.on_placed(a.placement, 1100, 1100)
    # r0 finishes at 1600; r1 is placed then, after 500 ms in the queue
    recorder.on_outcome(core.fleet.placement_of(request_key("default", "r0")), 1600)
    for a in core.on_outcome(request_key("default", "r0"), 1, OutcomeStatus.COMPLETED, None, 1600):
        assert isinstance(a, PlaceAction)
        recorder.on_placed(a.placement, 1100, 1600)
    (stats,) = recorder.snapshot(core, 2000)
    assert stats.pool == "m" and stats.window_s == 1.0
    assert stats.arrivals == 3 and stats.placed == 2 and stats.completed == 1
    assert stats.queue_wait_ms_p50 == 500 and stats.queue_wait_ms_max == 500
    assert stats.service_ms_mean == 500
    assert stats.queued == 1 and stats.oldest_wait_ms == 900
    assert stats.in_flight == 1
    assert stats.workers_ready == 1 and stats.workers_warming == 1
    (empty,) = recorder.snapshot(core, 3000)  # a new window
    assert empty.arrivals == 0 and empty.queue_wait_ms_p50 is None and empty.queued == 1


def test_pools_of_client_chosen_names_are_forgotten_once_idle() -> None:
    """Model names come from clients: a pool idle for forget_after_s is no longer kept, reported or exported."""
    core = SchedulerCore(Pipeline.load("default"))
    recorder = PoolStatsRecorder("i1", forget_after_s=60)
    minted = [f"minted-{i}" for i in range(200)]
    recorder.snapshot(core, 1000)
    for name in minted:
        recorder.on_arrival(name, 1100)
    assert {s.pool for s in recorder.snapshot(core, 2000)} == set(minted)
    recorder.on_arrival("m", 30_000)  # a pool still in use is kept
    recorder.snapshot(core, 31_000)
    assert len(recorder.snapshot(core, 61_000)) == 201  # idle 59 s: still reported (as idle)
    assert len(recorder.snapshot(core, 62_000)) == 201 and recorder.pools == {"m"}  # a last idle report
    assert [s.pool for s in recorder.snapshot(core, 63_000)] == ["m"]
    exposed = generate_latest().decode()
    assert "minted-" not in exposed
    assert 'llmbus_scheduler_arrivals_total{model_name="m"}' in exposed
    recorder.on_arrival("minted-7", 64_000)  # a name that comes back counts again
    assert ARRIVALS_TOTAL.labels("minted-7")._value.get() == 1
