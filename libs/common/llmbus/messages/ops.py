"""Experiments, comparisons, scaling, cost and dead letters."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from llmbus.messages.base import Message, Part, now_ms


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


class Feedback(Message):
    request_id: str
    tenant: str = "default"
    score: float = Field(ge=0.0, le=1.0)
    comment: str | None = None


class Comparison(Message):
    experiment_id: str
    variant: str
    samples: int
    latency_delta_ms_mean: float | None = None
    length_delta_tokens_mean: float | None = None
    similarity_mean: float | None = None
    error_rate: float | None = None
    p_value: float | None = None
    decision: Literal["promote", "hold", "rollback"] = "hold"


class ScaleDecision(Message):
    """On llm.scaling (key: pool): what the autoscaler decided, with what it saw, to audit and replay."""

    pool: str
    current_replicas: int
    desired_replicas: int
    reason: str
    policy: str
    decided_at_ms: int = Field(default_factory=now_ms)
    action: Literal["up", "down", "hold"] = "hold"
    signals: dict[str, float] = Field(default_factory=dict, description="signal values the policy decided on")
    actuator: str | None = Field(default=None, description="local | kubernetes | none (dry run)")


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
