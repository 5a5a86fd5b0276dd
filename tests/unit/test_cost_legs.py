"""A continued answer is billed per leg (services/cost_accounting/core/costing.py): each leg once, at its own
model's price or on its own worker's GPU ledger; the answer's cost is the sum of its legs' and the request is
counted once."""

from __future__ import annotations

from llmbus.contract.messages import (
    CostKind,
    CostRecord,
    InferenceResult,
    Leg,
    LegEnd,
    ResultStatus,
    Timings,
    Usage,
    WorkerState,
)
from llmbus_services.cost_accounting.core.aggregates import increments
from llmbus_services.cost_accounting.core.costing import ServedRequest, price_parts
from llmbus_services.cost_accounting.core.gpu_ledger import GpuLedger
from tests.unit.test_cost_ledger import BOOK, T0, heartbeat


def continued(legs: list[Leg], worker: str, model: str = "sim-llama-8b") -> InferenceResult:
    completion = sum(leg.completion_tokens for leg in legs)
    return InferenceResult(
        request_id="r1",
        tenant="acme",
        status=ResultStatus.OK,
        model=model,
        worker_id=worker,
        text="x" * completion,
        usage=Usage(prompt_tokens=legs[0].prompt_tokens, completion_tokens=completion),
        timings=Timings(engine_ms=4_000.0),
        completed_at_ms=T0 + 30_000,
        legs=legs,
        attempt=2,
    )


def test_hosted_legs_are_billed_each_at_its_models_price() -> None:
    legs = [
        Leg(
            attempt=1,
            worker_id="h1",
            model="gpt-4.1",
            prompt_tokens=1000,
            completion_tokens=200,
            ended=LegEnd.WORKER_LOST,
        ),
        Leg(attempt=2, worker_id="h2", model="gpt-4.1-mini", first_seq=12, prompt_tokens=1200, completion_tokens=300),
    ]
    parts = price_parts(continued(legs, "h2", "gpt-4.1-mini"), BOOK)
    assert all(isinstance(p, CostRecord) for p in parts)
    first, last = parts  # type: ignore[misc]
    assert (first.record_id, first.leg, first.model, first.worker_id) == ("acme:r1#leg0", 0, "gpt-4.1", "h1")
    assert (last.record_id, last.leg, last.model, last.worker_id) == ("acme:r1", None, "gpt-4.1-mini", "h2")
    assert first.cost_micro_usd == BOOK.hosted["gpt-4.1"].cost_micro(1000, 0, 200)
    assert last.cost_micro_usd == BOOK.hosted["gpt-4.1-mini"].cost_micro(1200, 0, 300)
    assert (first.completion_tokens, last.completion_tokens) == (200, 300)  # never the answer's 500 twice
    counted = [[f for _, f, _ in increments(r, "ns.") if f.endswith("|requests")] for r in (first, last)]
    assert counted[0] == [] and counted[1] != []  # the request is counted once, by its own record


def test_self_hosted_legs_are_priced_on_their_own_workers_ledgers() -> None:
    """Leg 1 on w1 (lost after 10 tokens), leg 2 on w2: each worker's GPU time is shared with the leg that ran
    there, each leg billed once under its own record id, and each worker's life adds up to its cost."""
    legs = [
        Leg(
            attempt=1,
            worker_id="w1",
            model="sim-llama-8b",
            prompt_tokens=50,
            completion_tokens=10,
            started_at_ms=T0 + 20_000,
            ended_at_ms=T0 + 22_000,
            ended=LegEnd.WORKER_LOST,
        ),
        Leg(
            attempt=2,
            worker_id="w2",
            model="sim-llama-8b",
            first_seq=3,
            prompt_tokens=60,
            completion_tokens=20,
            started_at_ms=T0 + 27_000,
        ),
    ]
    parts = price_parts(continued(legs, "w2"), BOOK)
    assert all(isinstance(p, ServedRequest) for p in parts)
    served: list[ServedRequest] = parts  # type: ignore[assignment]
    assert [(s.key, s.worker_id, s.start_ms, s.end_ms) for s in served] == [
        ("acme:r1#leg0", "w1", T0 + 20_000, T0 + 22_000),
        ("acme:r1", "w2", T0 + 27_000, T0 + 30_000),
    ]
    assert [(s.prefill_tokens, s.decode_tokens) for s in served] == [(50, 10), (60, 20)]
    ledger = GpuLedger(BOOK, interval_ms=60_000, grace_ms=1_000)
    records: list[CostRecord] = []
    for worker in ("w1", "w2"):
        ledger.observe(heartbeat(worker, T0, T0 + 1_000, 1.0, WorkerState.READY))
    records += ledger.add_all(served)
    for worker in ("w1", "w2"):
        ledger.observe(heartbeat(worker, T0, T0 + 60_000, 1.0, WorkerState.STOPPED))
    records += ledger.close(T0 + 200_000)
    mine = {r.record_id: r for r in records if r.request_id == "r1"}
    assert set(mine) == {"acme:r1#leg0", "acme:r1"}
    assert (mine["acme:r1#leg0"].worker_id, mine["acme:r1#leg0"].leg) == ("w1", 0)
    assert (mine["acme:r1"].worker_id, mine["acme:r1"].leg) == ("w2", None)
    assert all(r.kind == CostKind.SELF_HOSTED and r.cost_micro_usd > 0 for r in mine.values())
    for worker in ("w1", "w2"):
        life = sum(r.cost_micro_usd for r in records if r.worker_id == worker)
        assert life == BOOK.pool_rate("sim").cost_micro(60_000)  # its minute of life, each µUSD once
