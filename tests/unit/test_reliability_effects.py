"""The fault suite's own judges: an error no allowance covers (a code, a bound, which requests) fails a
scenario, and a cost record doubled on the stream or in Redis's totals fails the billing effect (they can fail)."""

from __future__ import annotations

from llmbus.audit import AuditReport
from llmbus.audit.bills import check_bills
from llmbus.contract.messages import BookedTo, CostKind, CostRecord
from llmbus.contract.request_key import request_key
from llmbus_tools.harness.reliability.effects import comparison_problems, cost_by, tenant_totals_of, totals_problems
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome


def cost(request_id: str, micro: int, booked_to: BookedTo = BookedTo.TENANT) -> CostRecord:
    return CostRecord(
        request_id=request_id,
        record_id=request_id,
        tenant="acme",
        model="m",
        cost_usd=micro / 1e6,
        cost_micro_usd=micro,
        booked_to=booked_to,
        kind=CostKind.HOSTED if booked_to == BookedTo.TENANT else CostKind.IDLE,
    )


def test_an_error_no_allowance_covers_fails_an_audit_that_passed() -> None:
    report = AuditReport(
        sent=4,
        answered=1,
        errored=3,
        error_results={"internal": 2, "queue_full": 1},
        errors_by_id={"a": "internal", "b": "internal", "c": "queue_full"},
    )
    assert report.passed  # the delivery audit alone: each request has its one result
    assert ErrorBudget().problems(report)  # nothing allowed: every error fails it
    enough = ErrorBudget().allow(("internal", "queue_full"), 3, "the outage")
    assert enough.problems(report) == []
    assert Outcome("s", report, 1.0, budget=enough).passed
    # A bound counts every code it covers together, and only the requests it names.
    assert ErrorBudget().allow(("internal", "queue_full"), 2, "x").problems(report) == [
        "3 error results under 'internal/queue_full <= 2: x'"
    ]
    only_a_b = ErrorBudget().allow(("internal", "queue_full"), 3, "x", ["a", "b"])
    assert only_a_b.problems(report) == ["1 queue_full error results no allowance covers, e.g. ['c']"]
    assert not Outcome("s", report, 1.0, budget=only_a_b).passed


def test_redis_totals_must_count_each_distinct_record_once() -> None:
    records = [cost("a", 5), cost("b", 7), cost("b", 7), cost("idle:w1:0", 100, BookedTo.PLATFORM)]
    stream = tenant_totals_of(records)
    assert stream == {"acme": (12, 2)}  # a copy of b counts once; idle is the platform's
    assert totals_problems(stream, {"acme": (12, 2)}) == []
    assert totals_problems(stream, {"acme": (19, 3)}) == [
        "tenant acme: llm.costs has (12, 2) (µUSD, requests), Redis totals (19, 3)"
    ]
    assert totals_problems(stream, {}) != []
    # The money overall and per model: every distinct record once, idle time included.
    assert cost_by(records, "total") == {"all": 112} and cost_by(records, "model") == {"m": 112}


def test_each_shadowed_pair_needs_one_comparison_and_none_for_no_pair() -> None:
    problems, copies = comparison_problems(["r1:e", "r2:e"], ["r1:e", "r1:e", "r2:e"])
    assert problems == [] and copies["r1:e"] == 2  # an identical redelivery: reported, readers dedupe on the id
    problems, _ = comparison_problems(["r1:e", "r2:e"], ["r1:e", "r3:e"])
    assert problems == ["comparisons missing (1): ['r2:e']", "comparisons of no pair (1): ['r3:e']"]


def test_two_tenants_continued_answers_of_one_id_are_billed_per_leg_each() -> None:
    """Legs and results keyed by request key (tenant and id): one id sent by two tenants is two results,
    each continued answer needs one record per leg."""

    def leg_record(tenant: str, leg: int | None) -> CostRecord:
        record = cost("r1", 3).model_copy(update={"tenant": tenant, "leg": leg})
        return record.model_copy(update={"record_id": f"{tenant}:r1" + ("" if leg is None else f"#leg{leg}")})

    def by_key(record: CostRecord) -> str:
        return request_key(record.tenant, record.request_id)

    keys, legs = ["a:r1", "b:r1"], {"a:r1": 2, "b:r1": 2}
    both = [leg_record("a", 0), leg_record("a", None), leg_record("b", 0), leg_record("b", None)]
    report = check_bills(both, keys, {}, legs, key_of=by_key)
    assert report.ok and report.billed == 2, report
    short = check_bills(both[:3], keys, {}, legs, key_of=by_key)  # b's last leg unbilled
    assert (short.billed, short.legs_unbilled) == (1, 1) and not short.ok
    by_id = check_bills(both, ["r1"], {}, {"r1": 2})  # by request id: 4 records, 1 two-leg result
    assert by_id.billed == 0
