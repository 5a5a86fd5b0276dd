"""The GPU ledger: request costs + idle (+ cold start) = instance-hours x price, to the micro-dollar."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from llmbus.contract.messages import (
    CostKind,
    CostRecord,
    FinishReason,
    InferenceResult,
    ResultStatus,
    Timings,
    Usage,
    WorkerState,
    WorkerStatus,
)
from llmbus_services.cost_accounting.core.aggregates import batch_increments, increments
from llmbus_services.cost_accounting.core.costing import ServedRequest, price_result
from llmbus_services.cost_accounting.core.gpu_ledger import GpuLedger
from llmbus_services.cost_accounting.core.money import cents
from llmbus_services.cost_accounting.core.prices import MS_PER_HOUR, load_pricebook
from llmbus_services.cost_accounting.core.savings import savings

BOOK = load_pricebook()
T0 = 1_780_000_000_000 - 1_780_000_000_000 % MS_PER_HOUR  # an hour boundary


def heartbeat(
    worker: str,
    started: int,
    sent: int,
    cold_s: float | None,
    state: WorkerState,
    phases: dict[str, float] | None = None,
) -> WorkerStatus:
    return WorkerStatus(
        cold_start_phases_s=phases or {},
        worker_id=worker,
        node_id="n",
        state=state,
        engine="sim",
        models=["sim-llama-8b"],
        cold_start_s=cold_s,
        started_at_ms=started,
        sent_at_ms=sent,
    )


def result(rid: str, worker: str, start: int, end: int, prompt: int, completion: int) -> InferenceResult:
    return InferenceResult(
        request_id=rid,
        tenant="acme",
        status=ResultStatus.OK,
        model="sim-llama-8b",
        worker_id=worker,
        usage=Usage(prompt_tokens=prompt, completion_tokens=completion),
        timings=Timings(engine_ms=float(end - start)),
        completed_at_ms=end,
    )


def run_life(
    ledger: GpuLedger,
    worker: str,
    started: int,
    cold_ms: int,
    life_ms: int,
    reqs: list,
    hb_ms: int = 1000,
    phases: dict[str, float] | None = None,
) -> list:
    """Heartbeats every hb_ms (results fed in as they complete), then STOPPED; close far in the future."""
    records = []
    end = started + life_ms
    pending = sorted(reqs, key=lambda r: r[1])
    t = started
    while t <= end:
        ready = t >= started + cold_ms
        state = WorkerState.STOPPED if t == end else (WorkerState.READY if ready else WorkerState.WARMING)
        ledger.observe(
            heartbeat(worker, started, t, cold_ms / 1000 if ready else None, state, phases if ready else None)
        )
        while pending and pending[0][1] <= t:
            rid, r_end, r_start, p, c = pending.pop(0)
            priced = price_result(result(rid, worker, r_start, r_end, p, c), BOOK)
            assert isinstance(priced, ServedRequest)
            records += ledger.add(priced)
        records += ledger.close(t)
        t = min(end, t + hb_ms) if t < end else end + 1
    records += ledger.close(end + 10 * ledger.grace_ms)
    return records


workloads = st.integers(0, 3 * MS_PER_HOUR).flatmap(
    lambda offset: st.tuples(
        st.just(T0 + offset),  # start
        st.integers(0, 120_000),  # cold start ms
        st.integers(130_000, 5 * 3_600_000 // 2),  # life ms (to 2.5 h)
        st.lists(
            st.tuples(st.floats(0, 1), st.integers(1, 90_000), st.integers(0, 4000), st.integers(0, 2000)), max_size=60
        ),
        st.sampled_from([60_000, 300_000, 3_600_000]),
    )
)


@settings(max_examples=60, deadline=None)
@given(workloads)
def test_conservation_per_worker_hour_and_life(work) -> None:
    started, cold_ms, life_ms, raw, interval_ms = work
    ledger = GpuLedger(BOOK, interval_ms=interval_ms, grace_ms=5_000, cold_start_requests=7, keep_bills=True)
    ready, end = started + cold_ms, started + life_ms
    reqs = []
    for i, (pos, dur, p, c) in enumerate(raw):
        r_start = ready + int(pos * (end - ready - 1))
        reqs.append((f"r{i}", min(end, r_start + dur), r_start, p, c))
    records = run_life(ledger, "w1", started, cold_ms, life_ms, reqs, hb_ms=7_000)
    rate = BOOK.pool_rate("sim")

    # every request billed exactly once, nothing late
    billed = [r for r in records if r.kind == CostKind.SELF_HOSTED]
    assert sorted(r.request_id for r in billed) == sorted(r[0] for r in reqs)
    assert ledger.late_results == 0

    # per worker and hour: GPU shares + idle + cold-start time = instance-hours in that hour x price
    per_hour: dict[int, int] = defaultdict(int)
    for bill in ledger.bills:
        assert sum(bill.shares_micro.values()) + bill.idle_micro + bill.cold_micro == bill.cost_micro
        per_hour[bill.start_ms - bill.start_ms % MS_PER_HOUR] += bill.cost_micro
    expected_total = 0
    for hour, micro in per_hour.items():
        alive_ms = max(0, min(end, hour + MS_PER_HOUR) - max(started, hour))
        assert micro == rate.cost_micro(alive_ms)
        assert cents(micro) == cents(rate.cost_micro(alive_ms))
        expected_total += micro

    # over the life: requests (GPU share + cold share) + idle + wasted cold start = the bill
    assert sum(r.cost_micro_usd for r in records) == expected_total
    waste = sum(r.cost_micro_usd for r in records if r.kind == CostKind.COLD_START_WASTE)
    cold_paid = sum(r.cold_start_micro_usd for r in billed)
    assert cold_paid + waste == sum(b.cold_micro for b in ledger.bills)
    if len(reqs) >= 7:
        assert waste == 0


def test_cold_start_amortised_and_wasted() -> None:
    ledger = GpuLedger(BOOK, interval_ms=60_000, grace_ms=1_000, cold_start_requests=4)
    # 60 s cold start at $0.495/h = 8250 µUSD; two requests served, then reclaimed
    reqs = [("a", T0 + 70_000, T0 + 61_000, 100, 100), ("b", T0 + 80_000, T0 + 71_000, 100, 100)]
    records = run_life(ledger, "w2", T0, 60_000, 90_000, reqs)
    by_kind = defaultdict(int)
    for r in records:
        by_kind[r.kind] += r.cost_micro_usd
    cold_total = BOOK.pool_rate("sim").cost_micro(60_000)
    assert cold_total == 8250
    shares = [r.cold_start_micro_usd for r in records if r.kind == CostKind.SELF_HOSTED]
    assert shares == [2062, 2063]  # 8250 // 4 twice, remainders spread exactly
    assert by_kind[CostKind.COLD_START_WASTE] == cold_total - sum(shares)
    assert sum(by_kind.values()) == BOOK.pool_rate("sim").cost_micro(90_000)


def test_the_cold_start_waste_record_carries_the_phases_of_the_start() -> None:
    ledger = GpuLedger(BOOK, interval_ms=60_000, grace_ms=1_000, cold_start_requests=4)
    phases = {"startup": 2.0, "fetch": 1.2, "verify": 0.3, "import": 8.0, "config": 1.0, "engine_process": 4.0}
    phases |= {"weights": 20.0, "kv_pool": 6.0, "kernels": 10.0, "warmup": 9.0}  # as a vllm worker's heartbeat
    records = run_life(ledger, "w5", T0, 60_000, 90_000, [("a", T0 + 70_000, T0 + 61_000, 100, 100)], phases=phases)
    [waste] = [r for r in records if r.kind == CostKind.COLD_START_WASTE]
    assert waste.cold_start_phases_s == phases
    assert all(not r.cold_start_phases_s for r in records if r.kind != CostKind.COLD_START_WASTE)


def test_a_failed_start_is_billed_once_as_cold_start_waste_and_ends_the_life() -> None:
    """A worker that heartbeats `starting` (fetching its model) for 30 s, then `failed` (a bad artifact), and exits:
    its 30 s are one cold_start_waste record, and nothing after (the life ended with the failure)."""
    ledger = GpuLedger(BOOK, interval_ms=60_000, grace_ms=1_000, cold_start_requests=4)
    records = []
    for t in range(T0, T0 + 30_001, 1000):
        ledger.observe(heartbeat("wf", T0, t, None, WorkerState.FAILED if t == T0 + 30_000 else WorkerState.STARTING))
        records += ledger.close(t)
    records += ledger.close(T0 + 3 * MS_PER_HOUR)
    assert [(r.kind, r.cost_micro_usd) for r in records] == [
        (CostKind.COLD_START_WASTE, BOOK.pool_rate("sim").cost_micro(30_000))
    ]


def test_result_after_the_life_closed_is_not_billed_twice() -> None:
    ledger = GpuLedger(BOOK, interval_ms=60_000, grace_ms=1_000, cold_start_requests=4)
    reqs = [("a", T0 + 70_000, T0 + 61_000, 100, 100)]
    records = run_life(ledger, "w4", T0, 60_000, 90_000, reqs)
    assert ledger.workers["w4"].waste_booked
    late = price_result(result("late", "w4", T0 + 75_000, T0 + 80_000, 100, 100), BOOK)
    assert isinstance(late, ServedRequest)
    records += ledger.add(late)
    assert ledger.late_results == 1
    # the cold start was already booked as the first request's share plus waste: the late one pays nothing
    assert [r.cost_micro_usd for r in records if r.request_id == "late"] == [0]
    assert sum(r.cost_micro_usd for r in records) == BOOK.pool_rate("sim").cost_micro(90_000)


def test_two_requests_share_an_interval_by_work() -> None:
    ledger = GpuLedger(
        BOOK,
        interval_ms=60_000,
        grace_ms=1_000,
        cold_start_requests=1_000_000,
        prefill_token_weight=0.0,
        decode_token_weight=1.0,
    )
    # same span, decode 300 vs 100 tokens: 3:1 split of the busy cost
    reqs = [("big", T0 + 50_000, T0 + 10_000, 0, 300), ("small", T0 + 50_000, T0 + 10_000, 0, 100)]
    records = run_life(ledger, "w3", T0, 0, 60_000, reqs)
    cost = {r.request_id: r.cost_micro_usd - r.cold_start_micro_usd for r in records if r.kind == CostKind.SELF_HOSTED}
    busy = BOOK.pool_rate("sim").cost_micro(40_000)
    assert cost["big"] + cost["small"] == busy
    assert abs(cost["big"] - 3 * cost["small"]) <= 3
    idle = sum(r.cost_micro_usd for r in records if r.kind == CostKind.IDLE)
    assert idle + busy + ledger.workers["w3"].cold_paid_micro + sum(
        r.cost_micro_usd for r in records if r.kind == CostKind.COLD_START_WASTE
    ) == BOOK.pool_rate("sim").cost_micro(60_000)


def test_output_cap_saving_is_an_upper_bound_only_when_the_cap_stopped_the_answer() -> None:
    def hosted(finish: FinishReason, completion: int, requested: int | None) -> CostRecord:
        r = InferenceResult(
            request_id=f"cap-{finish}-{requested}",
            tenant="acme",
            status=ResultStatus.OK,
            model="gpt-4.1-mini",
            finish_reason=finish,
            usage=Usage(prompt_tokens=100, completion_tokens=completion),
            max_tokens_requested=requested,
        )
        priced = price_result(r, BOOK)
        assert isinstance(priced, CostRecord)
        return priced

    # capped 50,000 -> 1,024 and stopped there: 48,976 tokens at gpt-4.1-mini's $1.60 / 1M output
    capped = hosted(FinishReason.LENGTH, 1024, 50_000)
    assert capped.output_cap_saving_micro_usd == BOOK.hosted["gpt-4.1-mini"].cost_micro(0, 0, 48_976) == 78_362
    assert hosted(FinishReason.STOP, 300, 50_000).output_cap_saving_micro_usd == 0  # the cap did not bind
    assert hosted(FinishReason.LENGTH, 1024, None).output_cap_saving_micro_usd == 0  # the client's own limit
    totals: dict[str, int] = defaultdict(int)
    for key, field, n in increments(capped, "ns:"):
        if ":agg:d" in key and key.endswith(":total") and field.startswith("all|"):  # the day's total
            totals[field.removeprefix("all|")] += n
    report = savings(dict(totals), BOOK)
    assert report.output_caps_usd == 0.078362
    assert report.actual_usd == capped.cost_usd  # the bound stays outside the billed amount


def test_batch_increments_are_the_sum_of_each_records() -> None:
    """The store applies a batch's summed increments in one script: they must equal record by record."""
    records: list[CostRecord] = []
    for i in range(300):
        fields: dict[str, object] = {
            "request_id": f"b{i}",
            "tenant": f"t{i % 5}",
            "status": ResultStatus.OK,
            "model": ["gpt-4.1", "gpt-4.1-mini"][i % 2],
            "usage": Usage(prompt_tokens=50 + 7 * i, cached_prompt_tokens=i % 40, completion_tokens=3 * i + 1),
            "completed_at_ms": T0 - 2 * MS_PER_HOUR + i * 40_000,  # across four hours
            "cached": i % 9 == 0,
            "shadow": i % 11 == 0,
            "experiment_id": "exp" if i % 4 == 0 else None,
            "variant": "cand" if i % 8 == 0 else None,
            "trimmed_tokens": i % 13,
        }
        priced = price_result(InferenceResult.model_validate(fields), BOOK)
        assert isinstance(priced, CostRecord)
        records.append(priced)
    expected: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for record in records:
        for key, field, by in increments(record, "ns."):
            expected[key][field] += by
    assert batch_increments(records, "ns.") == {k: dict(v) for k, v in expected.items()}


def test_a_cpu_node_pool_is_billed_by_the_node_hour() -> None:
    """An onnx worker on a CPU node (pool cpu-small): its hour costs the node's hourly price x overhead,
    shared among the requests it served and idle time, like a GPU pool's GPU-hours."""
    rate = BOOK.pool_rate("cpu-small")
    assert (rate.gpu, rate.usd_per_instance_hour) == ("cpu-16vcpu-64gb", Decimal("0.68") * Decimal("1.10"))
    ledger = GpuLedger(BOOK, interval_ms=60_000, grace_ms=5_000, cold_start_requests=1, keep_bills=True)
    records = []
    for t in range(T0, T0 + MS_PER_HOUR + 1, 30_000):
        state = WorkerState.STOPPED if t == T0 + MS_PER_HOUR else WorkerState.READY
        status = heartbeat("onnx-cpu-1", T0, t, 0.0, state).model_copy(
            update={"engine": "onnx", "models": ["tiny-onnx"]}
        )
        ledger.observe(status)
        if t == T0 + 600_000:
            served = result("r1", "onnx-cpu-1", t - 2_000, t, 40, 8).model_copy(update={"model": "tiny-onnx"})
            priced = price_result(served, BOOK)
            assert isinstance(priced, ServedRequest) and priced.pool == "cpu-small"
            records += ledger.add(priced)
        records += ledger.close(t)
    records += ledger.close(T0 + MS_PER_HOUR + 10 * ledger.grace_ms)
    assert sum(r.cost_micro_usd for r in records) == rate.cost_micro(MS_PER_HOUR) == 748_000  # $0.748 an hour
    (request,) = [r for r in records if r.kind == CostKind.SELF_HOSTED]
    assert request.request_id == "r1" and request.gpu == "cpu-16vcpu-64gb" and 0 < request.cost_micro_usd < 748_000
