"""Flow queue: priority, then fair turns across tenants, then deadline; expiry; the bound."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmbus.contract.request_key import request_key
from llmbus_services.scheduler.core.queue import FlowQueues, ModelQueue
from llmbus_services.scheduler.core.types import SchedRequest


def r(rid: str, tenant: str = "t", priority: int = 0, deadline_ms: int | None = None, arrived_at_ms: int = 0):
    return SchedRequest(
        request_id=rid,
        model="m",
        prompt_tokens=10,
        max_tokens=10,
        tenant=tenant,
        priority=priority,
        deadline_ms=deadline_ms,
        arrived_at_ms=arrived_at_ms,
    )


def order(q: ModelQueue) -> list[str]:
    return [x.request_id for x in q.in_order()]


def test_priority_first_then_deadline_then_arrival() -> None:
    q = ModelQueue()
    q.push(r("late-p0", priority=0, deadline_ms=900))
    q.push(r("p1", priority=1, deadline_ms=10))
    q.push(r("early-p0", priority=0, deadline_ms=100))
    q.push(r("nodeadline-p0", priority=0))
    q.push(r("early2-p0", priority=0, deadline_ms=100))
    assert order(q) == ["early-p0", "early2-p0", "late-p0", "nodeadline-p0", "p1"]


def test_tenants_take_turns_within_a_priority() -> None:
    q = ModelQueue()
    for i in range(4):
        q.push(r(f"big{i}", tenant="big"))
    q.push(r("small0", tenant="small"))
    q.push(r("small1", tenant="small"))
    assert order(q) == ["big0", "small0", "big1", "small1", "big2", "big3"]


def test_release_rotates_tenants_and_removes_placed() -> None:
    q = ModelQueue()
    for i in range(3):
        q.push(r(f"a{i}", tenant="a"))
    for i in range(3):
        q.push(r(f"b{i}", tenant="b"))
    budget = iter([True, True, True, False])  # capacity for three
    placed = q.release(lambda _req: next(budget), max_misses=1)
    assert [p.request_id for p in placed] == ["a0", "b0", "a1"]
    # b was served less recently than a: b goes first next time.
    assert order(q) == ["b1", "a2", "b2"]


def test_release_stops_after_max_misses() -> None:
    q = ModelQueue()
    for i in range(10):
        q.push(r(f"x{i}"))
    tried: list[str] = []

    def refuse(req) -> bool:
        tried.append(req.request_id)
        return False

    assert q.release(refuse, max_misses=3) == []
    assert tried == ["x0", "x1", "x2"] and len(q) == 10


def test_expire_takes_out_requests_past_deadline_or_wait_limit() -> None:
    q = ModelQueue(max_wait_ms=1000)
    q.push(r("soon", deadline_ms=500, arrived_at_ms=0))
    q.push(r("nodeadline", arrived_at_ms=0))
    q.push(r("later", deadline_ms=5000, arrived_at_ms=800))
    assert [x.request_id for x in q.expire(499)] == []
    assert [x.request_id for x in q.expire(500)] == ["soon"]
    assert [x.request_id for x in q.expire(1000)] == ["nodeadline"]
    assert [x.request_id for x in q.expire(1800)] == ["later"]  # its wait limit (800 + 1000) came first
    assert len(q) == 0


def test_bound_refuses_beyond_max_but_force_admits_retries() -> None:
    q = ModelQueue(max_queued=2)
    assert q.push(r("a")) and q.push(r("b"))
    assert not q.push(r("c"))
    assert "c" not in q
    assert q.push(r("a"))  # already queued: idempotent, no double entry
    assert len(q) == 2
    assert q.push(r("retry"), force=True) and len(q) == 3


def test_flow_queues_are_per_model() -> None:
    queues = FlowQueues(max_queued_per_model=1)
    assert queues.of("m1").push(r("a"))
    assert queues.of("m2").push(r("b"))
    assert len(queues) == 2 and queues.find(request_key("t", "b")) is queues.of("m2")


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from("xyz"), st.one_of(st.none(), st.integers(0, 50))), max_size=30
    )
)
def test_order_is_a_permutation_and_priorities_never_invert(items) -> None:
    q = ModelQueue()
    for i, (prio, tenant, deadline) in enumerate(items):
        q.push(r(f"r{i}", tenant=tenant, priority=prio, deadline_ms=deadline))
    out = list(q.in_order())
    assert sorted(x.request_id for x in out) == sorted(f"r{i}" for i in range(len(items)))
    assert [x.priority for x in out] == sorted(x.priority for x in out)
    for tenant in "xyz":  # within a tenant and priority, earliest deadline first
        for prio in range(3):
            mine = [
                x.deadline_ms if x.deadline_ms is not None else 2**62
                for x in out
                if x.tenant == tenant and x.priority == prio
            ]
            assert mine == sorted(mine)
