"""A model nobody serves is answered at once, and the route's fallback chain then applies."""

from __future__ import annotations

from llmbus.contract.messages import ErrorCode, InferenceRequest, RoutedRequest, WorkerState, WorkerStatus
from llmbus.domain.fallback import fall_back
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.scheduler import CoreConfig, FinalError, PlaceAction, SchedulerCore
from llmbus_services.scheduler.core.types import SchedRequest


def core_with_worker(model: str, now_ms: int) -> SchedulerCore:
    core = SchedulerCore(Pipeline.load("default"), CoreConfig(seed=0))
    core.on_heartbeat(
        WorkerStatus(
            worker_id="w1",
            node_id="n",
            state=WorkerState.READY,
            engine="sim",
            models=[model],
            max_model_len=8192,
            max_num_seqs=8,
            kv_blocks_total=1000,
            kv_blocks_free=1000,
        ),
        now_ms,
    )
    core.tick(now_ms)
    return core


def routed(model: str, chain: list[str]) -> RoutedRequest:
    return RoutedRequest(request=InferenceRequest(prompt="hi " * 10, max_tokens=8), model=model, fallback_chain=chain)


def test_unserved_model_is_unavailable_once_the_fleet_is_known_and_falls_back() -> None:
    core = core_with_worker("small", now_ms=1_000)
    later = 1_000 + core.config.heartbeat_timeout_ms + 1
    core.on_heartbeat(
        WorkerStatus(
            worker_id="w1",
            node_id="n",
            state=WorkerState.READY,
            engine="sim",
            models=["small"],
            max_model_len=8192,
            max_num_seqs=8,
            kv_blocks_total=1000,
            kv_blocks_free=1000,
        ),
        later,
    )
    big = routed("big", ["small"])
    [action] = core.submit(SchedRequest.from_routed(big, later, 16, 64), later)
    assert isinstance(action, FinalError) and action.error.code == ErrorCode.MODEL_UNAVAILABLE
    hop = fall_back(big, "big", action.error.code)
    assert hop is not None and hop.model == "small" and hop.route_reason == "fallback:big->small:model_unavailable"
    [placed] = core.submit(SchedRequest.from_routed(hop, later, 16, 64), later)
    assert isinstance(placed, PlaceAction) and placed.placement.worker_id == "w1"


def test_right_after_start_an_unknown_model_waits_for_heartbeats() -> None:
    core = core_with_worker("small", now_ms=1_000)
    actions = core.submit(SchedRequest.from_routed(routed("big", ["small"]), 1_001, 16, 64), 1_001)
    assert actions == [], "queued: its worker's heartbeat may not have been read yet"
    later = 1_000 + core.config.heartbeat_timeout_ms + 1
    [answered] = core.tick(later)
    assert isinstance(answered, FinalError) and answered.error.code == ErrorCode.MODEL_UNAVAILABLE


def test_without_a_fallback_chain_a_request_waits_for_a_worker_to_come() -> None:
    core = core_with_worker("small", now_ms=1_000)
    later = 1_000 + core.config.heartbeat_timeout_ms + 1
    assert core.submit(SchedRequest.from_routed(routed("big", []), later, 16, 64), later) == []
    assert not [a for a in core.tick(later + 1) if isinstance(a, FinalError)]


def test_a_late_heartbeat_stream_is_no_missing_fleet() -> None:
    """llm.workers' leader failing over to another broker (the 3-broker `leader_sigkill` scenario)
    stalls every worker's heartbeats at once: past the timeout the workers are still placed on and a
    request with a fallback is not answered model_unavailable, until the lag cap (6 timeouts)."""
    core = core_with_worker("small", now_ms=1_000)
    stalled = 1_000 + 2 * core.config.heartbeat_timeout_ms  # nothing read from llm.workers since 1_000
    [placed] = core.submit(SchedRequest.from_routed(routed("small", ["big"]), stalled, 16, 64), stalled)
    assert isinstance(placed, PlaceAction) and placed.placement.worker_id == "w1"
    assert core.fleet.dead_workers(stalled, core.config.heartbeat_timeout_ms) == []
    gone = 1_000 + 6 * core.config.heartbeat_timeout_ms + 1
    [refused] = core.submit(SchedRequest.from_routed(routed("small", ["big"]), gone, 16, 64), gone)
    assert isinstance(refused, FinalError) and refused.error.code == ErrorCode.MODEL_UNAVAILABLE


def test_one_worker_silent_while_others_are_heard_is_not_placed_on() -> None:
    core = core_with_worker("small", now_ms=1_000)
    later = 1_000 + core.config.heartbeat_timeout_ms + 1
    core.on_heartbeat(
        WorkerStatus(
            worker_id="w2",
            node_id="n",
            state=WorkerState.READY,
            engine="sim",
            models=["other"],
            max_model_len=8192,
            max_num_seqs=8,
            kv_blocks_total=1000,
            kv_blocks_free=1000,
        ),
        later,
    )
    [refused] = core.submit(SchedRequest.from_routed(routed("small", ["big"]), later, 16, 64), later)
    assert isinstance(refused, FinalError) and refused.error.code == ErrorCode.MODEL_UNAVAILABLE
