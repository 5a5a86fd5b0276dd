"""The billing audit (pure): was every result billed exactly once, and did GPU time add up?

A strict checker in the style of `check.py`: a record id on llm.costs twice counts as doubled
even when both copies are identical (a faithful record stream has each record once), a result
with no record is unbilled, a record for a result that was never sent is extra. A continued
answer is billed per leg (`CostRecord.leg`): it is billed once when it has one record for each of
its legs, and its cost is theirs summed. Per worker,
the records booked to it (requests, idle, cold-start waste) must add up to what its life cost
(instance-ms x rate): `ratio` is 1.0 when every GPU-millisecond was billed once (two replicas
each pricing a whole interval gave 1.97).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from llmbus.contract.messages import CostRecord

MAX_EXAMPLES = 20


@dataclass
class BillReport:
    results: int = 0  # result ids expected to be billed
    billed: int = 0  # of them, billed by exactly one record
    unbilled: int = 0  # no record
    legs_unbilled: int = 0  # a continued answer with some of its legs' records missing
    doubled: int = 0  # record ids on the stream more than once (identical copies included)
    extra: int = 0  # records pricing a result that was not sent
    worker_cost_micro: dict[str, int] = field(default_factory=dict)
    expected_worker_cost_micro: dict[str, int] = field(default_factory=dict)
    problems: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Billed GPU cost over what the workers' lives cost (1.0: each millisecond once)."""
        expected = sum(self.expected_worker_cost_micro.values())
        return sum(self.worker_cost_micro.values()) / expected if expected else 1.0

    @property
    def ok(self) -> bool:
        return (
            not (self.unbilled or self.legs_unbilled or self.doubled or self.extra)
            and self.worker_cost_micro == self.expected_worker_cost_micro
        )

    def note(self, kind: str, example: str) -> None:
        examples = self.problems.setdefault(kind, [])
        if len(examples) < MAX_EXAMPLES:
            examples.append(example)


def check_bills(
    records: Iterable[CostRecord],
    result_ids: Iterable[str],
    expected_worker_cost_micro: Mapping[str, int],
    legs: Mapping[str, int] | None = None,
    key_of: Callable[[CostRecord], str] = lambda record: record.request_id,
) -> BillReport:
    """`records`: llm.costs as read; `result_ids`: the results sent; `expected_worker_cost_micro`:
    worker id -> what its life cost (the checked workers; others' records are not summed); `legs`:
    result -> the legs of its answer, where more than one (each is billed by a record of its own).
    `key_of`: what of a record names its result (its request id; or its request key, tenant and id,
    where `result_ids` and `legs` are request keys: two tenants' requests of one id are two results)."""
    legs = legs or {}
    report = BillReport(expected_worker_cost_micro=dict(expected_worker_cost_micro))
    wanted = set(result_ids)
    report.results = len(wanted)
    copies = Counter[str]()
    priced = Counter[str]()  # result -> its records (one per leg)
    for record in records:
        copies[record.record_id] += 1
        if (worker := record.worker_id) is not None and worker in expected_worker_cost_micro:
            report.worker_cost_micro[worker] = report.worker_cost_micro.get(worker, 0) + record.cost_micro_usd
        if (key := key_of(record)) in wanted:
            priced[key] += 1
        elif record.prices_a_result:
            report.extra += 1
            report.note("extra", record.record_id)
    for worker in expected_worker_cost_micro:
        report.worker_cost_micro.setdefault(worker, 0)
    for record_id, n in copies.items():
        if n > 1:
            report.doubled += 1
            report.note("doubled", f"{record_id} x{n}")
    for request_id in sorted(wanted):
        expected = legs.get(request_id, 1)
        if priced[request_id] == 0:
            report.unbilled += 1
            report.note("unbilled", request_id)
        elif priced[request_id] < expected:
            report.legs_unbilled += 1
            report.note("legs_unbilled", f"{request_id}: {priced[request_id]} of {expected} legs billed")
        elif priced[request_id] == expected:
            report.billed += 1
    return report
