"""Experiments, comparisons, scaling, cost and dead letters."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from llmbus.messages.base import Message, Part, now_ms
from llmbus.messages.experiments import ExperimentState, Guardrails, PairSide, RampPlan


class Variant(Part):
    name: str
    model: str
    weight: float = Field(ge=0.0, description="Share of traffic; variants' weights are normalised.")


class Experiment(Message):
    """On llm.experiments (compacted, key: experiment id)."""

    experiment_id: str
    kind: Literal["ab", "shadow"]
    salt: str = ""
    enabled: bool = True
    match_models: list[str] = Field(default_factory=list, description="Applies to requests routed to these models.")
    variants: list[Variant] = Field(default_factory=list)
    shadow_model: str | None = None
    shadow_share: float = Field(default=0.0, ge=0.0, le=1.0)
    shadow_reply_topic: str = "llm.shadow"
    updated_at_ms: int = Field(default_factory=now_ms)
    # The lifecycle (llmbus experiments …, shadow-comparator): the router reads only the fields
    # above, which the lifecycle keeps in step with the current ramp step.
    control_model: str | None = None
    candidate_model: str | None = None
    state: ExperimentState = ExperimentState.RUNNING
    ramp: RampPlan | None = Field(default=None, description="None: a plain experiment nobody ramps")
    step: int = Field(default=0, ge=0, description="index into ramp.steps_pct")
    step_started_at_ms: int = Field(default_factory=now_ms)
    guardrails: Guardrails = Field(default_factory=Guardrails)
    ab_shadow_share: float = Field(default=1.0, ge=0.0, le=1.0, description="shadow share used at the shadow step")
    note: str = ""


class Feedback(Message):
    request_id: str
    tenant: str = "default"
    score: float = Field(ge=0.0, le=1.0)
    comment: str | None = None


class Comparison(Message):
    """On llm.comparisons (key: experiment id): one per joined primary/shadow pair.

    `comparison_id` (primary request id + experiment id) is the same on a redelivery, so a
    reader dedupes on it.
    """

    comparison_id: str
    experiment_id: str
    request_id: str = Field(description="the primary (control) request id")
    control: PairSide
    candidate: PairSide
    ttft_delta_ms: float | None = Field(default=None, description="candidate minus control")
    total_delta_ms: float | None = None
    length_delta_tokens: int = 0
    similarity: float | None = Field(default=None, ge=0.0, le=1.0, description="None when either side failed")
    similarity_metric: str = "rouge_l_f1"
    compared_at_ms: int = Field(default_factory=now_ms)


class ScaleDecision(Message):
    pool: str
    current_replicas: int
    desired_replicas: int
    reason: str
    policy: str
    decided_at_ms: int = Field(default_factory=now_ms)


class CostRecord(Message):
    request_id: str
    tenant: str
    model: str
    cost_usd: float
    experiment_id: str | None = None
    cached_saving_usd: float = 0.0


class BudgetState(StrEnum):
    OK = "ok"
    WARN = "warn"
    OVER = "over"


class BudgetStatus(Message):
    """On llm.budgets (compacted, key: tenant)."""

    tenant: str
    period: str = "month"
    spent_usd: float = 0.0
    limit_usd: float | None = None
    state: BudgetState = BudgetState.OK
    updated_at_ms: int = Field(default_factory=now_ms)


class DeadLetter(Message):
    """On llm.dlq (key: the original key): the raw bytes and why they could not be handled."""

    source_topic: str
    source_partition: int
    source_offset: int
    raw_key_b64: str | None = None
    raw_value_b64: str
    error_code: str
    error: str
    service: str
    request_id: str | None = None
    failed_at_ms: int = Field(default_factory=now_ms)
