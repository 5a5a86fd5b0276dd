"""Recovery decisions and the core's promise: every request ends placed or with a final error."""

from __future__ import annotations

from llmbus.contract.messages import EarlierAttempt, ErrorCode, ErrorInfo, OutcomeStatus, WorkerState
from llmbus.contract.request_key import request_key
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.recovery import Done, GiveUp, RecoveryPolicy, Retry
from llmbus_services.scheduler.core.scheduler import CoreConfig, FinalError, PlaceAction, SchedulerCore
from llmbus_services.scheduler.core.types import Placement
from tests.unit.test_sched_filters import NOW_MS, hb, req


def placement(attempt: int = 1, worker: str = "w1") -> Placement:
    return Placement("r1", attempt, worker, "m", 10, NOW_MS, req(attempt=attempt))


def test_retryable_outcome_places_again_excluding_the_failed_worker() -> None:
    decision = RecoveryPolicy(max_attempts=3).on_outcome(
        placement(1), OutcomeStatus.RETRYABLE, ErrorInfo.of(ErrorCode.ENGINE_OOM, "oom")
    )
    assert isinstance(decision, Retry)
    assert decision.request.attempt == 2 and decision.request.excluded_workers == {"w1"}
    assert decision.reason == ErrorCode.ENGINE_OOM


def test_last_attempt_gives_up_with_max_attempts() -> None:
    decision = RecoveryPolicy(max_attempts=3).on_outcome(
        placement(3), OutcomeStatus.RETRYABLE, ErrorInfo.of(ErrorCode.OVER_CAPACITY, "full")
    )
    assert isinstance(decision, GiveUp) and decision.error.code == ErrorCode.MAX_ATTEMPTS


def test_completed_and_failed_outcomes_are_done() -> None:
    for status in (OutcomeStatus.COMPLETED, OutcomeStatus.FAILED, OutcomeStatus.DUPLICATE):
        assert isinstance(RecoveryPolicy().on_outcome(placement(), status, None), Done)


def test_worker_lost_retries_each_request() -> None:
    decisions = RecoveryPolicy().on_worker_lost([placement(1, "w1"), placement(3, "w1")])
    assert isinstance(decisions[0], Retry) and decisions[0].reason == ErrorCode.WORKER_LOST
    assert isinstance(decisions[1], GiveUp)


def core(pipeline: str = "default", **kw) -> SchedulerCore:
    return SchedulerCore(Pipeline.load(pipeline), CoreConfig(seed=0, **kw))


def test_dead_worker_requests_move_to_a_live_worker() -> None:
    c = core(heartbeat_timeout_ms=1000)
    c.tick(NOW_MS)  # the scheduler starts watching
    c.on_heartbeat(hb("w1"), NOW_MS)
    [a1] = c.submit(req(request_id="r1"), NOW_MS)
    assert isinstance(a1, PlaceAction) and a1.placement.worker_id == "w1"
    c.on_heartbeat(hb("w2", sent_at_ms=NOW_MS + 900), NOW_MS + 900)
    assert c.tick(NOW_MS + 900) == []  # w1 silent 900 ms: still alive
    c.on_heartbeat(hb("w2", sent_at_ms=NOW_MS + 1001), NOW_MS + 1001)
    actions = c.tick(NOW_MS + 1001)
    assert [(a.placement.worker_id, a.placement.attempt) for a in actions] == [("w2", 2)]
    assert "w1" not in c.fleet.workers
    # A late outcome of the dead worker's attempt is ignored; the new attempt's completes.
    assert c.on_outcome(request_key("default", "r1"), 1, OutcomeStatus.COMPLETED, None, NOW_MS + 1100) == []
    assert c.fleet.placement_of(request_key("default", "r1")).attempt == 2
    c.on_outcome(request_key("default", "r1"), 2, OutcomeStatus.COMPLETED, None, NOW_MS + 1200)
    assert c.fleet.placement_of(request_key("default", "r1")) is None


def test_retry_goes_to_another_worker_then_max_attempts() -> None:
    c = core(max_attempts=2)
    c.on_heartbeat(hb("w1"), NOW_MS)
    c.on_heartbeat(hb("w2"), NOW_MS)
    [first] = c.submit(req(request_id="r1"), NOW_MS)
    failed = ErrorInfo.of(ErrorCode.ENGINE_FAILED, "sampler hiccup")
    [second] = c.on_outcome(request_key("default", "r1"), 1, OutcomeStatus.RETRYABLE, failed, NOW_MS + 10)
    assert isinstance(second, PlaceAction)
    assert second.placement.worker_id != first.placement.worker_id and second.placement.attempt == 2
    [final] = c.on_outcome(request_key("default", "r1"), 2, OutcomeStatus.RETRYABLE, failed, NOW_MS + 20)
    assert isinstance(final, FinalError) and final.error.code == ErrorCode.MAX_ATTEMPTS
    # Attempt 2 ran (it may have streamed): its error is published as the next attempt (placement flow).
    assert final.ran and final.request.attempt == 2


def test_an_error_of_a_request_that_never_ran_keeps_its_attempt() -> None:
    c = core()
    c.on_heartbeat(hb("w1", max_num_seqs=1), NOW_MS)
    c.submit(req(request_id="r1"), NOW_MS)
    c.submit(req(request_id="r2", deadline_ms=NOW_MS + 100), NOW_MS)
    [late] = c.tick(NOW_MS + 100)
    assert isinstance(late, FinalError) and late.error.code == ErrorCode.DEADLINE_EXCEEDED and not late.ran


def test_full_fleet_queues_then_releases_when_capacity_frees() -> None:
    c = core()
    c.on_heartbeat(hb("w1", max_num_seqs=1), NOW_MS)
    [a] = c.submit(req(request_id="r1"), NOW_MS)
    assert isinstance(a, PlaceAction)
    assert c.submit(req(request_id="r2"), NOW_MS) == []  # waits
    assert request_key("default", "r2") in c.queues.of("m")
    [b] = c.on_outcome(request_key("default", "r1"), 1, OutcomeStatus.COMPLETED, None, NOW_MS + 5)
    assert isinstance(b, PlaceAction) and b.request.request_id == "r2"


def test_queued_request_times_out_at_its_deadline() -> None:
    c = core()
    c.on_heartbeat(hb("w1", max_num_seqs=1), NOW_MS)
    c.submit(req(request_id="r1"), NOW_MS)
    c.submit(req(request_id="r2", deadline_ms=NOW_MS + 100), NOW_MS)
    c.on_heartbeat(hb("w1", max_num_seqs=1), NOW_MS + 50)
    assert c.tick(NOW_MS + 99) == []
    [t] = c.tick(NOW_MS + 100)
    assert isinstance(t, FinalError) and t.error.code == ErrorCode.DEADLINE_EXCEEDED
    assert t.request.request_id == "r2"


def test_a_model_nobody_serves_ends_unavailable_after_the_wait_and_a_late_request_past_its_deadline() -> None:
    """No live worker of the model for the whole wait: model_unavailable with a retry-after (a worker
    that starts is known within a heartbeat timeout), which the gateway answers as 503; a request
    whose own deadline passed is late (504) either way."""
    c = core(max_wait_ms=1000, heartbeat_timeout_ms=500)
    c.tick(NOW_MS)  # the scheduler starts watching
    c.on_heartbeat(hb("w1", models=["other"]), NOW_MS)
    assert c.submit(req(request_id="r1", arrived_at_ms=NOW_MS), NOW_MS) == []  # no fallback: waits for a worker
    assert c.submit(req(request_id="r2", arrived_at_ms=NOW_MS, deadline_ms=NOW_MS + 1000), NOW_MS) == []
    assert c.tick(NOW_MS + 999) == []
    ended = {a.request.request_id: a.error for a in c.tick(NOW_MS + 1000) if isinstance(a, FinalError)}
    assert ended["r1"].code == ErrorCode.MODEL_UNAVAILABLE and ended["r1"].retry_after_ms == 500
    assert ended["r2"].code == ErrorCode.DEADLINE_EXCEEDED


def test_a_wait_limit_reached_before_the_fleet_is_known_waits_for_it() -> None:
    """A scheduler that started less than a heartbeat timeout ago cannot tell "nobody serves the
    model" from "not heard yet": a request at its wait limit then keeps waiting, and ends
    model_unavailable once the fleet is known; its own deadline still ends it on time."""
    c = core(max_wait_ms=300, heartbeat_timeout_ms=1000)
    c.tick(NOW_MS)  # the scheduler starts watching
    c.on_heartbeat(hb("w1", models=["other"]), NOW_MS)
    c.submit(req(request_id="r1", arrived_at_ms=NOW_MS), NOW_MS)
    c.submit(req(request_id="r2", arrived_at_ms=NOW_MS, deadline_ms=NOW_MS + 400), NOW_MS)
    assert c.tick(NOW_MS + 300) == []  # r1 at its wait limit, the fleet not known yet
    [late] = c.tick(NOW_MS + 400)
    assert isinstance(late, FinalError) and late.request.request_id == "r2"
    assert late.error.code == ErrorCode.DEADLINE_EXCEEDED
    assert c.tick(NOW_MS + 999) == []
    [unavailable] = [a for a in c.tick(NOW_MS + 1000) if isinstance(a, FinalError)]
    assert unavailable.request.request_id == "r1" and unavailable.error.code == ErrorCode.MODEL_UNAVAILABLE


def test_bounded_queue_answers_queue_full() -> None:
    c = core(max_queued_per_model=2)
    c.on_heartbeat(hb("w1", max_num_seqs=1), NOW_MS)
    out = [c.submit(req(request_id=f"r{i}"), NOW_MS) for i in range(5)]
    assert isinstance(out[0][0], PlaceAction)
    assert out[1] == [] and out[2] == []
    assert all(isinstance(o[0], FinalError) and o[0].error.code == ErrorCode.QUEUE_FULL for o in out[3:])


def test_no_worker_at_all_waits_then_times_out_and_too_long_fails_at_once() -> None:
    c = core(max_wait_ms=1000, heartbeat_timeout_ms=500)
    c.tick(NOW_MS)  # the scheduler starts watching
    assert c.submit(req(request_id="r1"), NOW_MS) == []
    [t] = c.tick(NOW_MS + 1000)
    assert t.error.code == ErrorCode.MODEL_UNAVAILABLE
    c.on_heartbeat(hb("w1", max_model_len=100), NOW_MS + 1000)
    [e] = c.submit(req(90, 20, request_id="r2"), NOW_MS + 1000)
    assert e.error.code == ErrorCode.PROMPT_TOO_LONG
    # Within the max length but larger than the whole KV cache (10 blocks of 16 = 160 tokens).
    c.on_heartbeat(hb("w1", max_model_len=8192, kv_blocks_total=10, kv_blocks_free=10), NOW_MS + 1000)
    [e] = c.submit(req(150, 20, request_id="r3"), NOW_MS + 1000)
    assert e.error.code == ErrorCode.PROMPT_TOO_LONG and "KV cache" in e.error.message
    assert isinstance(c.submit(req(140, 20, request_id="r4"), NOW_MS + 1000)[0], PlaceAction)


def test_stopped_or_draining_worker_gets_nothing_new_and_stopped_loses_its_requests() -> None:
    c = core()
    c.on_heartbeat(hb("w1"), NOW_MS)
    c.submit(req(request_id="r1"), NOW_MS)
    c.on_heartbeat(hb("w1", state=WorkerState.DRAINING), NOW_MS + 1)
    assert c.submit(req(request_id="r2"), NOW_MS + 1) == []  # queued: w1 drains
    c.on_heartbeat(hb("w2"), NOW_MS + 2)  # r2 released to w2
    assert c.fleet.placement_of(request_key("default", "r2")).worker_id == "w2"
    actions = c.on_heartbeat(hb("w1", state=WorkerState.STOPPED), NOW_MS + 3)
    assert [(a.request.request_id, a.placement.worker_id, a.placement.attempt) for a in actions] == [("r1", "w2", 2)]


def test_redelivered_routed_record_is_not_placed_twice() -> None:
    c = core()
    c.on_heartbeat(hb("w1"), NOW_MS)
    assert len(c.submit(req(request_id="r1"), NOW_MS)) == 1
    assert c.submit(req(request_id="r1"), NOW_MS) == []


def test_heartbeats_replayed_at_startup_do_not_revive_a_dead_worker() -> None:
    c = core(heartbeat_timeout_ms=1000)
    c.tick(NOW_MS)
    c.on_heartbeat(hb("old", sent_at_ms=NOW_MS - 60_000), NOW_MS, replayed=True)  # read back from the compacted topic
    assert c.submit(req(request_id="r1"), NOW_MS) == []  # not placed on a silent worker: it waits
    c.on_heartbeat(hb("new", sent_at_ms=NOW_MS + 1001), NOW_MS + 1001)
    assert c.fleet.placement_of(request_key("default", "r1")).worker_id == "new"
    c.tick(NOW_MS + 1001)  # a full timeout after the scheduler started watching, and far behind "new"
    assert "old" not in c.fleet.workers


def test_a_lagging_scheduler_does_not_declare_the_whole_fleet_dead() -> None:
    c = core(heartbeat_timeout_ms=1000)
    c.tick(NOW_MS)
    for w in ("w1", "w2"):
        c.on_heartbeat(hb(w, sent_at_ms=NOW_MS), NOW_MS)
    c.submit(req(request_id="r1"), NOW_MS)
    # 3 s without reading any heartbeat: our lag, not theirs (both equally silent).
    assert c.tick(NOW_MS + 3000) == [] and set(c.fleet.workers) == {"w1", "w2"}
    # Past the lag cap (6 timeouts) a fleet that died all at once is dead after all.
    c.on_heartbeat(hb("w3", sent_at_ms=NOW_MS + 6001), NOW_MS + 6001)
    [moved] = c.tick(NOW_MS + 6001)
    assert moved.placement.worker_id == "w3" and moved.placement.attempt == 2
    assert set(c.fleet.workers) == {"w3"}


def test_restored_placements_count_and_are_replaced_when_their_worker_never_returns() -> None:
    c = core(heartbeat_timeout_ms=1000)
    c.fleet.restore([Placement("r1", 1, "gone", "m", 10, NOW_MS, req(request_id="r1"))])
    assert c.fleet.workers["gone"].inflight_count == 1
    assert c.tick(NOW_MS) == []  # restart: every worker gets a full timeout to be heard from
    c.on_heartbeat(hb("w2", sent_at_ms=NOW_MS + 500), NOW_MS + 500)
    assert c.tick(NOW_MS + 1000) == []
    [a] = c.tick(NOW_MS + 1001)
    assert (a.placement.worker_id, a.placement.attempt) == ("w2", 2)


def test_a_restarted_worker_ids_earlier_requests_are_placed_again_at_once() -> None:
    """w1 was SIGKILLed and its supervisor started it again: its new process's first heartbeat (a later start)
    means what the earlier one ran is lost. Placed again now, each with the attempt it had on record (the next
    worker continues what it streamed), not after the old process's group membership times out."""
    c = core(heartbeat_timeout_ms=5000)
    c.tick(NOW_MS)
    c.on_heartbeat(hb("w1", started_at_ms=NOW_MS - 60_000), NOW_MS)
    c.on_heartbeat(hb("w2", started_at_ms=NOW_MS - 60_000), NOW_MS)
    [placed] = c.submit(req(request_id="r1", session_id="s"), NOW_MS)
    lost_on = placed.placement.worker_id  # type: ignore[union-attr]
    actions = c.on_heartbeat(hb(lost_on, started_at_ms=NOW_MS + 500, sent_at_ms=NOW_MS + 600), NOW_MS + 600)
    [again] = [a for a in actions if isinstance(a, PlaceAction)]
    assert again.placement.attempt == 2 and again.placement.worker_id != lost_on
    [earlier] = again.request.earlier
    assert (earlier.attempt, earlier.worker_id, earlier.ended) == (1, lost_on, ErrorCode.WORKER_LOST)
    # a heartbeat of the same process, or one replayed at the scheduler's start, changes nothing
    assert c.on_heartbeat(hb(lost_on, started_at_ms=NOW_MS + 500, sent_at_ms=NOW_MS + 700), NOW_MS + 700) == []


def _restart(c: SchedulerCore, worker: str, at_ms: int) -> list:
    """`worker` SIGKILLed and started again: its new process's first heartbeat."""
    return c.on_heartbeat(hb(worker, started_at_ms=at_ms - 100, sent_at_ms=at_ms), at_ms)


def test_attempts_whose_text_the_answer_continues_do_not_use_up_max_attempts() -> None:
    """sigkill_sampled_workers (long): an answer cut on w1, continued on w2, cut by w2's SIGKILL, continued on w3
    and cut by w3's: three attempts, each a leg of the answer. Legs are bounded by the answer's migration_limit
    (its next worker enforces it), not by max_attempts: the request goes on as attempt 4."""
    c = core(max_attempts=3, heartbeat_timeout_ms=5000)
    c.tick(NOW_MS)
    for worker in ("w1", "w2", "w3", "w4"):
        c.on_heartbeat(hb(worker), NOW_MS)
    [first] = c.submit(req(request_id="r1"), NOW_MS)
    assert isinstance(first, PlaceAction)
    order, at = [first.placement.worker_id], NOW_MS
    for attempt in (2, 3):
        at += 1000
        [again] = [a for a in _restart(c, order[-1], at) if isinstance(a, PlaceAction)]
        assert again.placement.attempt == attempt
        order.append(again.placement.worker_id)
    at += 1000
    [final] = _restart(c, order[-1], at)
    assert isinstance(final, FinalError) and final.error.code == ErrorCode.MAX_ATTEMPTS
    assert final.gave_up is not None and final.gave_up.failed is not None and final.gave_up.failed.attempt == 3
    # The flow read the reply topic: attempts 1-3 each streamed text the answer so far is made of.
    actions = c.retry_legs(final, {1, 2, 3}, at)
    assert actions is not None
    [placed] = actions
    assert isinstance(placed, PlaceAction) and placed.placement.attempt == 4
    assert placed.request.legs_forgiven == 3
    assert placed.request.excluded_workers == set(order)
    assert [e.attempt for e in placed.request.earlier] == [1, 2, 3]
    assert c.stats.final_errors.get(ErrorCode.MAX_ATTEMPTS.value, 0) == 0


def test_attempts_that_streamed_nothing_still_end_with_max_attempts() -> None:
    c = core(max_attempts=2, heartbeat_timeout_ms=5000)
    c.tick(NOW_MS)
    for worker in ("w1", "w2"):
        c.on_heartbeat(hb(worker), NOW_MS)
    [first] = c.submit(req(request_id="r1"), NOW_MS)
    assert isinstance(first, PlaceAction)
    [again] = [a for a in _restart(c, first.placement.worker_id, NOW_MS + 1000) if isinstance(a, PlaceAction)]
    [final] = _restart(c, again.placement.worker_id, NOW_MS + 2000)
    assert isinstance(final, FinalError) and final.gave_up is not None
    assert c.retry_legs(final, set(), NOW_MS + 2000) is None  # no text: both attempts count
    assert c.stats.final_errors[ErrorCode.MAX_ATTEMPTS.value] == 1


def test_only_legs_under_the_model_now_are_forgiven_and_failures_without_text_still_count() -> None:
    policy = RecoveryPolicy(max_attempts=2)
    request = req(attempt=5)
    request.earlier = [EarlierAttempt(attempt=n, worker_id="w1", ended=ErrorCode.WORKER_LOST) for n in range(1, 5)]
    failed = Placement("r1", 5, "w2", "m", 10, NOW_MS, request)
    decision = policy.retry(failed, ErrorCode.WORKER_LOST, "no heartbeat")
    assert isinstance(decision, GiveUp) and decision.failed is failed
    # Attempts 2 and 5 streamed text the answer continues; 1, 3 and 4 failed without: 3 counted of 2.
    assert isinstance(policy.retry_legs(decision, {2, 5}), GiveUp)
    # 4 legs: 1 counted, attempt 6 goes out; a leg number beyond the failed attempt is not one of its.
    again = policy.retry_legs(decision, {1, 2, 3, 5, 9})
    assert isinstance(again, Retry) and again.request.attempt == 6 and again.request.legs_forgiven == 4


def test_a_give_up_that_is_not_max_attempts_names_nothing_to_decide_again() -> None:
    oom = ErrorInfo.of(ErrorCode.ENGINE_OOM, "oom")
    policy = RecoveryPolicy(max_attempts=3, max_oom_retries=0)
    decision = policy.on_outcome(placement(1), OutcomeStatus.RETRYABLE, oom)
    assert isinstance(decision, GiveUp) and decision.error.code == ErrorCode.ENGINE_OOM and decision.failed is None
    assert policy.retry_legs(decision, {1}) is decision
