"""A self-hosted result handed to the ledger twice is priced once.

Pure core with an injected clock. The handler of llm.results and a tick reading the held results
can both hand the ledger one result (the tick read it between the handler holding it and adding
it). Twice pending, the interval's close priced it twice under one record id: the first copy
with the request's GPU share, the second at 0 µUSD.
"""

from __future__ import annotations

from llmbus.audit.bills import check_bills
from llmbus.contract.messages import CostKind, WorkerState, WorkerStatus
from llmbus_services.cost_accounting.core.costing import ServedRequest, price_result
from llmbus_services.cost_accounting.core.gpu_ledger import GpuLedger
from llmbus_services.cost_accounting.core.prices import MS_PER_HOUR, load_pricebook
from tests.unit.test_cost_ledger import heartbeat, result

BOOK = load_pricebook()
T0 = 1_780_000_000_000 - 1_780_000_000_000 % MS_PER_HOUR


def beat(sent_ms: int, state: WorkerState = WorkerState.READY) -> WorkerStatus:
    return heartbeat("w1", T0, sent_ms, 0.0, state)


def served(rid: str, start_ms: int, end_ms: int) -> ServedRequest:
    priced = price_result(result(rid, "w1", T0 + start_ms, T0 + end_ms, 300, 120), BOOK)
    assert isinstance(priced, ServedRequest)
    return priced


def test_a_result_added_twice_is_priced_once() -> None:
    ledger = GpuLedger(BOOK, interval_ms=60_000, grace_ms=1_000)
    ledger.observe(beat(T0 + 1_000))
    r1, r2 = served("r1", 5_000, 20_000), served("r2", 10_000, 40_000)
    for one in (r1, r2, r1, r2):  # the handler of llm.results, then a tick from the held results
        assert ledger.add(one) == []
    records = []
    for sent_ms in (60_500, 62_000, 90_000):
        ledger.observe(beat(T0 + sent_ms, WorkerState.STOPPED if sent_ms == 90_000 else WorkerState.READY))
        records += ledger.close(T0 + sent_ms)
    records += ledger.close(T0 + 200_000)
    requests = [r for r in records if r.kind == CostKind.SELF_HOSTED]
    assert sorted(r.record_id for r in requests) == ["acme:r1", "acme:r2"]  # `<tenant>:<request id>`
    assert all(r.cost_micro_usd > 0 for r in requests)
    report = check_bills(records, ["r1", "r2"], {"w1": BOOK.pool_rate("sim").cost_micro(90_000)})
    assert report.ok, report


def test_a_late_result_added_twice_is_priced_once() -> None:
    """A late result (its interval closed before it came: a continued answer's leg on a worker that died) is
    priced at once; a tick that reads it from Redis before the handler released it there must not price it
    again under the same record id."""
    ledger = GpuLedger(BOOK, interval_ms=60_000, grace_ms=1_000)
    for sent_ms in (1_000, 60_500, 62_000):
        ledger.observe(beat(T0 + sent_ms))
    ledger.close(T0 + 62_000)  # the first interval is closed
    late = served("r1", 5_000, 20_000)
    [record] = ledger.add(late)
    assert record.record_id == "acme:r1" and ledger.late_results == 1
    assert ledger.add(late) == [] and ledger.late_results == 1
