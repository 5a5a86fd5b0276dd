"""The fault suite's own judges: an error beyond the bound fails a scenario, and a cost record
doubled on the stream or in Redis's totals fails the billing effect (they can fail)."""

from __future__ import annotations

from llmbus.audit import AuditReport
from llmbus.contract.messages import BookedTo, CostKind, CostRecord
from llmbus_tools.harness.reliability.effects import comparison_problems, tenant_totals_of, totals_problems
from llmbus_tools.harness.reliability.stack import Outcome, over_bound


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


def test_error_results_beyond_the_bound_fail_an_audit_that_passed() -> None:
    report = AuditReport(sent=3, answered=3, ok_results=1, error_results={"internal": 2})
    assert report.passed  # the delivery audit alone counts an error as answered
    assert over_bound(report, {"internal": 2}) == []
    assert over_bound(report, {}) == ["2 internal error results, at most 0 allowed"]
    assert not Outcome("s", report, 1.0, error_bound={}).passed
    assert Outcome("s", report, 1.0, error_bound={"internal": 2}).passed


def test_redis_totals_must_count_each_distinct_record_once() -> None:
    records = [cost("a", 5), cost("b", 7), cost("b", 7), cost("idle:w1:0", 100, BookedTo.PLATFORM)]
    stream = tenant_totals_of(records)
    assert stream == {"acme": (12, 2)}  # a copy of b counts once; idle is the platform's
    assert totals_problems(stream, {"acme": (12, 2)}) == []
    assert totals_problems(stream, {"acme": (19, 3)}) == [
        "tenant acme: llm.costs has (12, 2) (µUSD, requests), Redis totals (19, 3)"
    ]
    assert totals_problems(stream, {}) != []


def test_each_shadowed_pair_needs_one_comparison_and_none_for_no_pair() -> None:
    problems, copies = comparison_problems(["r1:e", "r2:e"], ["r1:e", "r1:e", "r2:e"])
    assert problems == [] and copies["r1:e"] == 2  # an identical redelivery: reported, readers dedupe on the id
    problems, _ = comparison_problems(["r1:e", "r2:e"], ["r1:e", "r3:e"])
    assert problems == ["comparisons missing (1): ['r2:e']", "comparisons of no pair (1): ['r3:e']"]
