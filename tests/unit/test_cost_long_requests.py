"""A self-hosted request longer than interval + grace pays for every interval it ran in.

Pure core with an injected clock: a worker heartbeats every second and says when its oldest
running request started; the ledger holds the intervals that request runs in open until its
result can be there. Before, a 10-minute request paid only its last interval (9.8 % of its GPU
time) and the rest was booked as idle.
"""

from __future__ import annotations

from llmbus.audit.bills import check_bills
from llmbus.contract.messages import CostKind, CostRecord, InferenceResult, WorkerState, WorkerStatus
from llmbus_services.cost_accounting.core.costing import ServedRequest, price_result
from llmbus_services.cost_accounting.core.gpu_ledger import GpuLedger
from llmbus_services.cost_accounting.core.prices import MS_PER_HOUR, load_pricebook
from tests.unit.test_cost_ledger import heartbeat, result

BOOK = load_pricebook()
T0 = 1_780_000_000_000 - 1_780_000_000_000 % MS_PER_HOUR


def beat(sent_ms: int, oldest_ms: int | None, state: WorkerState = WorkerState.READY) -> WorkerStatus:
    running = {"num_requests_running": 0 if oldest_ms is None else 1, "oldest_running_started_at_ms": oldest_ms}
    return heartbeat("w1", T0, sent_ms, 0.0, state).model_copy(update=running)


def run(requests: list[tuple[str, int, int]], life_ms: int, grace_ms: int = 30_000) -> tuple[list[CostRecord], int]:
    """Heartbeats each second (the worker's clock), each result published as its request ends,
    the ledger closed after every heartbeat; then the worker stops. Returns records and life cost."""
    ledger = GpuLedger(BOOK, interval_ms=60_000, grace_ms=grace_ms)
    records: list[CostRecord] = []
    results: dict[int, list[InferenceResult]] = {}
    for rid, start, end in requests:
        results.setdefault(end, []).append(result(rid, "w1", T0 + start, T0 + end, 1000, 2000))
    for now in range(0, life_ms + 1, 1000):
        for r in results.get(now, []):
            served = price_result(r, BOOK)
            assert isinstance(served, ServedRequest)
            records += ledger.add(served)
        running = [start for _, start, end in requests if start <= now < end]
        state = WorkerState.STOPPED if now == life_ms else WorkerState.READY
        ledger.observe(beat(T0 + now, T0 + min(running) if running else None, state))
        records += ledger.close(T0 + now)
    records += ledger.close(T0 + life_ms + 10 * grace_ms)
    return records, BOOK.pool_rate("sim").cost_micro(life_ms)


def test_ten_minute_request_pays_for_all_its_gpu_time() -> None:
    records, life_micro = run([("long", 10_000, 610_000)], life_ms=720_000)
    report = check_bills(records, ["long"], {"w1": life_micro})
    assert report.ok, report
    rate = BOOK.pool_rate("sim")
    (long,) = [r for r in records if r.request_id == "long"]
    assert long.kind == CostKind.SELF_HOSTED
    assert long.gpu_busy_ms == 600_000
    # its 600 s at the pool's rate, give or take a micro-dollar of rounding per interval it touched
    assert abs(long.cost_micro_usd - rate.cost_micro(600_000)) <= 11
    idle = sum(r.cost_micro_usd for r in records if r.kind == CostKind.IDLE)
    assert abs(idle - rate.cost_micro(120_000)) <= 13


def test_long_and_short_requests_share_intervals_and_add_up() -> None:
    """Short requests end (and their results arrive) while the long one holds their intervals
    open: they are priced when those intervals close, the worker's life adds up exactly."""
    reqs = [("long", 5_000, 400_000)] + [(f"s{i}", 20_000 * i, 20_000 * i + 7_000) for i in range(1, 25)]
    records, life_micro = run(reqs, life_ms=540_000)
    report = check_bills(records, [rid for rid, _, _ in reqs], {"w1": life_micro})
    assert report.ok, report
    busy = {r.request_id: r.gpu_busy_ms for r in records if r.kind == CostKind.SELF_HOSTED}
    assert busy["long"] == 395_000 and all(busy[f"s{i}"] == 7_000 for i in range(1, 25))


def test_a_request_stuck_past_the_hold_limit_does_not_stop_billing() -> None:
    ledger = GpuLedger(BOOK, interval_ms=60_000, grace_ms=30_000, max_hold_ms=120_000)
    records: list[CostRecord] = []
    for now in range(0, 400_001, 1000):  # a request started at 1 s never ends
        ledger.observe(beat(T0 + now, T0 + 1000))
        records += ledger.close(T0 + now)
    closed = ledger.workers["w1"].closed_until_ms - T0
    assert 200_000 <= closed <= 300_000  # held max_hold_ms, then closing again
    assert {r.kind for r in records} == {CostKind.IDLE}
