"""The experiment lifecycle: guardrails, ramp plans, per-pair sides and the decisions taken.

Experiment and Comparison themselves live in `messages/ops.py` (the topics' value types);
the parts they are built from, and ExperimentDecision (on llm.decisions), live here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from llmbus.contract.messages.base import Message, Part, now_ms
from llmbus.contract.messages.release import ReleaseContext

DEFAULT_RAMP_PCT = (0.0, 1.0, 5.0, 25.0, 50.0, 100.0)


class ExperimentState(StrEnum):
    RUNNING = "running"  # the decision loop may ramp it
    PAUSED = "paused"  # traffic split frozen, no ramping, guardrails still roll back
    STOPPED = "stopped"  # candidate gets nothing; an operator ended it
    ROLLED_BACK = "rolled_back"  # candidate gets nothing; a guardrail broke
    PROMOTED = "promoted"  # candidate gets everything


class Guardrails(Part):
    """Limits the candidate must stay within; one breach rolls its share back to 0 at once."""

    max_error_rate: float = Field(default=0.05, ge=0.0, le=1.0, description="candidate's error rate ceiling")
    max_error_rate_increase: float = Field(default=0.02, ge=0.0, le=1.0, description="candidate minus control")
    max_p95_regression: float = Field(
        default=0.25, ge=0.0, description="candidate p95 total latency over control's, as a fraction (0.25 = +25 %)"
    )
    max_negative_feedback_rate: float = Field(default=0.3, ge=0.0, le=1.0)
    min_similarity: float = Field(default=0.5, ge=0.0, le=1.0, description="shadow: mean similarity to control")
    max_format_failure_rate: float = Field(
        default=0.1, ge=0.0, le=1.0, description="shadow: candidate answers empty, refused or not JSON when expected"
    )
    min_samples: int = Field(default=30, ge=1, description="per variant (pairs in shadow) before any verdict")
    alpha: float = Field(default=0.05, gt=0.0, lt=1.0, description="sequential tests' type-I error")


class RampPlan(Part):
    """Candidate shares (percent) step by step; 0 is the shadow stage (users see only control)."""

    steps_pct: list[float] = Field(default_factory=lambda: list(DEFAULT_RAMP_PCT), min_length=1)
    min_samples_per_step: int = Field(default=200, ge=1, description="candidate samples at a step before ramping")
    min_step_s: float = Field(default=60.0, ge=0.0, description="time at a step before ramping")
    auto: bool = Field(default=True, description="the decision loop ramps by itself while guardrails hold")


class FormatCheck(Part):
    json_expected: bool = False
    json_valid: bool | None = None
    empty: bool = False
    truncated: bool = False
    refusal: bool = False

    @property
    def failed(self) -> bool:
        return self.empty or self.refusal or (self.json_expected and self.json_valid is False)


class PairSide(Part):
    """One side (control or candidate) of a compared pair, as its InferenceResult described it."""

    request_id: str
    model: str | None = None
    status: str = "ok"
    error_class: str = "ok"
    finish_reason: str | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    completion_tokens: int = 0
    format: FormatCheck = Field(default_factory=FormatCheck)


class VariantEvidence(Part):
    """What the decision loop saw of one variant (control, candidate, or the shadow pairs)."""

    variant: str
    model: str
    samples: int = 0
    error_rate: float | None = None
    completion_rate: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    cost_per_request_usd: float | None = None
    feedback_samples: int = 0
    negative_feedback_rate: float | None = None
    similarity_mean: float | None = None
    format_failure_rate: float | None = None


class StatEvidence(Part):
    """A sequential test's state: always-valid p-value and confidence sequence of the difference."""

    metric: str  # "error_rate", "completion_rate", "latency_ms", ...
    estimate: float  # candidate minus control
    ci_low: float
    ci_high: float
    p_value: float  # always valid: stays a p-value however often it is looked at
    method: str = "msprt"


class ExperimentDecision(Message):
    """On llm.decisions (key: experiment id): every verdict of the decision loop, with its evidence."""

    experiment_id: str
    decision: Literal["promote", "hold", "rollback"]
    reasons: list[str] = Field(default_factory=list)
    step_from: int
    step_to: int
    share_from_pct: float
    share_to_pct: float
    state: ExperimentState
    variants: list[VariantEvidence] = Field(default_factory=list)
    tests: list[StatEvidence] = Field(default_factory=list)
    decided_at_ms: int = Field(default_factory=now_ms)
    release: ReleaseContext | None = Field(
        default=None, description="A release's decision: the release and the stage the evidence is from."
    )
