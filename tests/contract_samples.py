"""One message of each kind analytics reads, with its topic and the ce_* values it must carry."""

from __future__ import annotations

from dataclasses import dataclass

from llmbus.contract import topics as t
from llmbus.contract.messages import (
    BudgetStatus,
    Comparison,
    CostRecord,
    ExperimentDecision,
    ExperimentState,
    InferenceResult,
    Message,
    PairSide,
    ResultStatus,
    ScaleDecision,
    Usage,
)

T0_MS = 1_764_600_000_123  # 2025-12-01T14:40:00.123Z


@dataclass(frozen=True)
class Sample:
    topic: str
    key: str
    message: Message
    ce_type: str
    ce_id: str
    ce_subject: str


SAMPLES = [
    Sample(
        t.RESULTS,
        "r1",
        InferenceResult(
            request_id="r1",
            tenant="acme",
            status=ResultStatus.OK,
            model="m",
            usage=Usage(prompt_tokens=5, completion_tokens=7),
            completed_at_ms=T0_MS,
        ),
        "io.llmbus.result.v1",
        "acme/r1",
        "acme",
    ),
    Sample(
        t.COSTS,
        "acme",
        CostRecord(
            request_id="r1",
            record_id="r1",
            tenant="acme",
            model="m",
            cost_usd=0.000012,
            cost_micro_usd=12,
            booked_at_ms=T0_MS,
        ),
        "io.llmbus.cost.v1",
        "acme/r1",
        "acme",
    ),
    Sample(
        t.COMPARISONS,
        "exp1",
        Comparison(
            comparison_id="r1:exp1",
            experiment_id="exp1",
            request_id="r1",
            control=PairSide(request_id="r1"),
            candidate=PairSide(request_id="r1.shadow.exp1"),
            compared_at_ms=T0_MS,
        ),
        "io.llmbus.comparison.v1",
        "r1:exp1",
        "exp1",
    ),
    Sample(
        t.DECISIONS,
        "exp1",
        ExperimentDecision(
            experiment_id="exp1",
            decision="hold",
            step_from=1,
            step_to=1,
            share_from_pct=10.0,
            share_to_pct=10.0,
            state=ExperimentState.RUNNING,
            decided_at_ms=T0_MS,
        ),
        "io.llmbus.decision.v1",
        f"exp1/1-1/{T0_MS}",
        "exp1",
    ),
    Sample(
        t.SCALING,
        "pool-a",
        ScaleDecision(
            pool="pool-a", current_replicas=1, desired_replicas=2, reason="queue", policy="p", decided_at_ms=T0_MS
        ),
        "io.llmbus.scaling.v1",
        f"pool-a/{T0_MS}",
        "pool-a",
    ),
    Sample(
        t.BUDGETS,
        "acme",
        BudgetStatus(tenant="acme", period_key="2025-12", updated_at_ms=T0_MS),
        "io.llmbus.budget.v1",
        f"acme/2025-12/{T0_MS}",
        "acme",
    ),
]
