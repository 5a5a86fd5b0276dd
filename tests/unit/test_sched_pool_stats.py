"""The scheduler's per-pool statistics: queue wait, TTFT and prefill backlog, arrivals, in flight, workers."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from llmbus.contract.messages import DispatchOutcome, OutcomeStatus, WorkerState, WorkerStatus
from llmbus.contract.request_key import request_key
from llmbus.observability.metric_children import MODEL_LABELS
from llmbus_services.scheduler.adapters.pool_stats import ARRIVALS_TOTAL, TTFT_SECONDS, PoolStatsRecorder
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


def test_pools_of_client_chosen_names_are_bounded_exported_as_other_and_forgotten_once_idle() -> None:
    """Model names come from clients: of the names no worker or registry knows only the busiest
    `max_unknown_pools` are reported, their series are one `other` series, and a pool idle for
    forget_after_s is no longer kept or reported; a known pool is always reported."""
    core = SchedulerCore(Pipeline.load("default"))
    MODEL_LABELS.learn(["m"])  # known: the fleet or the registry named it
    recorder = PoolStatsRecorder("i1", forget_after_s=60, max_unknown_pools=16)
    minted = [f"minted-{i}" for i in range(200)]
    recorder.snapshot(core, 1000)
    for name in minted:
        recorder.on_arrival(name, 1100)
    for _ in range(3):  # the busiest unknown name
        recorder.on_arrival("minted-199", 1100)
    recorder.on_arrival("m", 1100)
    reported = {s.pool for s in recorder.snapshot(core, 2000)}
    assert "m" in reported and "minted-199" in reported and len(reported) == 1 + 16
    recorder.on_arrival("m", 30_000)  # a pool still in use is kept
    recorder.snapshot(core, 31_000)
    assert len(recorder.snapshot(core, 61_000)) == 17  # idle 59 s: still kept (reported as idle)
    assert recorder.pools == {"m"} | set(minted)
    recorder.snapshot(core, 62_000)
    assert recorder.pools == {"m"}
    assert [s.pool for s in recorder.snapshot(core, 63_000)] == ["m"]
    exposed = generate_latest().decode()
    assert "minted-" not in exposed
    assert 'llmbus_scheduler_arrivals_total{model_name="m"}' in exposed
    assert 'llmbus_scheduler_arrivals_total{model_name="other"}' in exposed
    before = ARRIVALS_TOTAL.labels("other")._value.get()
    recorder.on_arrival("minted-7", 64_000)  # a name that comes back counts again, as `other`
    assert ARRIVALS_TOTAL.labels("other")._value.get() == before + 1


def test_latency_inside_the_engine_and_the_work_in_tokens() -> None:
    """TTFT and time per output token from the outcomes over the sliding latency window; the prefill
    backlog from the workers' heartbeats plus what was placed since; tokens of arrivals and completions;
    KV use; and the Prometheus series KEDA reads."""
    core = SchedulerCore(Pipeline.load("default"))
    MODEL_LABELS.learn(["m"])  # known: the fleet or the registry named it
    recorder = PoolStatsRecorder("i1", latency_window_s=10)
    heartbeat = status("w1", WorkerState.READY, 1000).model_copy(
        update={"max_num_seqs": 8, "prefill_backlog_tokens": 3000, "kv_blocks_free": 600}
    )
    core.on_heartbeat(heartbeat, 1000)
    recorder.snapshot(core, 1000)
    placements = []
    for i in range(3):
        recorder.on_arrival("m", 1100, prompt_tokens=500)
        (action,) = core.submit(SchedRequest(f"r{i}", "m", 500, 10, arrived_at_ms=1100), 1100)
        assert isinstance(action, PlaceAction)
        recorder.on_placed(action.placement, 1100, 1100)
        placements.append(action.placement)
    outcome = DispatchOutcome(
        request_id="r0", worker_id="w1", attempt=1, status=OutcomeStatus.COMPLETED, completion_tokens=10,
        ttft_ms=2500.0, tpot_ms=40.0,
    )  # fmt: skip
    recorder.on_outcome(placements[0], 1500, outcome)
    recorder.on_outcome(placements[1], 1600, outcome.model_copy(update={"ttft_ms": 500.0, "tpot_ms": 20.0}))
    (stats,) = recorder.snapshot(core, 2000)
    assert stats.queue_wait_ms_p99 == 0  # placed at once ...
    assert (stats.ttft_samples, stats.ttft_ms_p50, stats.ttft_ms_p99) == (2, 2500.0, 2500.0)  # ... and slow
    assert (stats.tpot_ms_p50, stats.tpot_ms_p99, stats.latency_window_s) == (40.0, 40.0, 10.0)
    # the engine's 3,000 at its heartbeat plus the three prompts placed after it (none cached)
    assert stats.prefill_backlog_tokens == 3000 + 3 * 500
    assert (stats.arrival_prompt_tokens, stats.completion_tokens) == (1500, 20)
    assert stats.kv_cache_usage_perc_mean == stats.kv_cache_usage_perc_max == pytest.approx(0.4)
    exposed = generate_latest().decode()
    assert 'llmbus_scheduler_time_to_first_token_seconds_bucket{le="2.0",model_name="m"} 1.0' in exposed
    assert 'llmbus_scheduler_time_to_first_token_seconds_bucket{le="2.5",model_name="m"} 2.0' in exposed
    assert 'llmbus_scheduler_prefill_backlog_tokens{model_name="m"} 4500.0' in exposed
    assert 'llmbus_scheduler_kv_cache_usage_perc{model_name="m"} 0.4' in exposed
    # the latency window slides: 10 s on, nothing finished since is left in it; the next window's counts start at zero
    (later,) = recorder.snapshot(core, 11_600)
    assert later.ttft_samples == 0 and later.ttft_ms_p99 is None and later.arrival_prompt_tokens == 0
    # a model name no process knows is timed under `other`, as every pool series is
    before = TTFT_SECONDS.labels("other")._sum.get()
    recorder.on_outcome(replace(placements[2], model="minted-9"), 1700, outcome)
    assert TTFT_SECONDS.labels("other")._sum.get() == pytest.approx(before + 2.5)
    assert "minted-9" not in generate_latest().decode()
