"""The scheduler core under request-level faults: final vs retryable errors, busy upstreams,
workers with clocks behind, and bounded queues (issue 9, defects 6, 7 and 10)."""

from __future__ import annotations

from llmbus.contract.messages import ErrorCode, ErrorInfo, OutcomeStatus
from llmbus.contract.request_key import request_key
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.queue import FlowQueues
from llmbus_services.scheduler.core.scheduler import CoreConfig, FinalError, PlaceAction, SchedulerCore
from tests.unit.test_sched_filters import NOW_MS, hb, req


def core(**kw: object) -> SchedulerCore:
    return SchedulerCore(Pipeline.load("default"), CoreConfig(seed=0, **kw))  # type: ignore[arg-type]


def placed_on(actions: list) -> list[tuple[str, int]]:  # type: ignore[type-arg]
    return [(a.placement.worker_id, a.placement.attempt) for a in actions if isinstance(a, PlaceAction)]


def test_an_invalid_request_reported_retryable_is_final_not_retried_elsewhere() -> None:
    c = core()
    for w in ("w1", "w2"):
        c.on_heartbeat(hb(w), NOW_MS)
    [first] = c.submit(req(request_id="r1"), NOW_MS)
    wid = first.placement.worker_id
    invalid = ErrorInfo.of(ErrorCode.INVALID_REQUEST, "upstream HTTP 400")
    [action] = c.on_outcome(request_key("default", "r1"), 1, OutcomeStatus.RETRYABLE, invalid, NOW_MS + 10)
    assert isinstance(action, FinalError) and action.error.code == ErrorCode.INVALID_REQUEST
    assert wid in c.fleet.workers and c.stats.retried == 0


def test_a_busy_upstream_cools_its_worker_down_and_the_retry_backs_off_then_goes_elsewhere() -> None:
    c = core()
    for w in ("w1", "w2"):
        c.on_heartbeat(hb(w), NOW_MS)
    [first] = c.submit(req(request_id="r1"), NOW_MS)
    busy_worker = first.placement.worker_id
    other = "w2" if busy_worker == "w1" else "w1"
    busy = ErrorInfo.of(ErrorCode.OVER_CAPACITY, "upstream HTTP 429", retry_after_ms=7_000)
    assert c.on_outcome(request_key("default", "r1"), 1, OutcomeStatus.RETRYABLE, busy, NOW_MS) == []  # backing off
    assert c.submit(req(request_id="r1"), NOW_MS) == []  # held: a redelivery is not taken twice
    assert placed_on(c.tick(NOW_MS + c.recovery.backoff_ms(1))) == [(other, 2)]
    # The busy worker takes nothing new until Retry-After has passed, even when it is the only choice.
    del c.fleet.workers[other]
    assert c.submit(req(request_id="r2"), NOW_MS + 1_000) == []
    assert placed_on(c.tick(NOW_MS + 6_999)) == []
    assert placed_on(c.on_heartbeat(hb(busy_worker), NOW_MS + 7_000)) == [(busy_worker, 1)]


def test_liveness_is_judged_by_receive_time_not_the_workers_clock() -> None:
    c = core(heartbeat_timeout_ms=1_000)
    c.tick(NOW_MS)
    # A worker whose clock is a minute behind heartbeats every 300 ms: it is alive.
    for i in range(10):
        c.on_heartbeat(hb("slow-clock", sent_at_ms=NOW_MS - 60_000 + i * 300), NOW_MS + i * 300)
        c.on_heartbeat(hb("ok", sent_at_ms=NOW_MS + i * 300), NOW_MS + i * 300)
        assert "slow-clock" in c.fleet.workers and c.tick(NOW_MS + i * 300) == []
    assert c.fleet.workers["slow-clock"].last_heartbeat_ms == NOW_MS + 2_700


def test_one_tenant_cannot_fill_the_queue_others_still_get_in() -> None:
    c = core(max_queued_per_tenant=3, max_queued_per_model=100)  # no workers: everything waits
    results = [c.submit(req(request_id=f"a{i}", tenant="a"), NOW_MS) for i in range(5)]
    assert [len(r) for r in results] == [0, 0, 0, 1, 1]
    refused = results[3][0]
    # The tenant's own limit (HTTP 429), not the fleet's capacity (queue_full, 503).
    assert isinstance(refused, FinalError) and refused.error.code == ErrorCode.RATE_LIMITED
    assert "tenant 'a'" in refused.error.message and refused.error.retry_after_ms == 1000
    assert c.submit(req(request_id="b0", tenant="b"), NOW_MS) == []  # another tenant is still queued
    assert len(c.queues) == 4


def test_empty_model_queues_are_dropped() -> None:
    c = core(max_wait_ms=1_000, heartbeat_timeout_ms=500)
    c.tick(NOW_MS)  # the scheduler starts watching
    for i in range(200):
        c.submit(req(request_id=f"r{i}", model=f"model-{i}"), NOW_MS)  # every name seen once
    assert len(c.queues.by_model) == 200
    c.tick(NOW_MS + 1_000)  # all time out
    assert c.queues.by_model == {}


def test_flow_queues_count_a_tenant_over_all_models() -> None:
    queues = FlowQueues(max_queued_per_model=10, max_queued_per_tenant=2)
    assert queues.admit(req(request_id="x1", tenant="t", model="m1")) is None
    assert queues.admit(req(request_id="x2", tenant="t", model="m2")) is None
    assert queues.admit(req(request_id="x3", tenant="t", model="m3")) is not None
    assert queues.admit(req(request_id="x3", tenant="t", model="m3"), force=True) is None  # a retry is never lost
    queues.of("m1").remove(request_key("t", "x1"))
    queues.prune()
    assert set(queues.by_model) == {"m2", "m3"} and queues.queued_of("t") == 2
