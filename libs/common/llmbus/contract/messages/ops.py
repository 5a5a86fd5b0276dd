"""Experiments, comparisons, scaling, cost and dead letters."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import Field

from llmbus.contract.messages.base import Message, Part, now_ms
from llmbus.contract.messages.experiments import ExperimentState, Guardrails, PairSide, RampPlan
from llmbus.contract.messages.genai import WithGenAi, gen_ai_object
from llmbus.contract.messages.release import ReleaseContext


class Variant(Part):
    name: str
    model: str
    weight: float = Field(ge=0.0, description="Share of traffic; variants' weights are normalised.")
    version: str | None = Field(default=None, description="A registry version of `model`; None: any that serves it.")


class Experiment(Message):
    """On llm.experiments (compacted, key: experiment id)."""

    experiment_id: str
    kind: Literal["ab", "shadow"]
    salt: str = ""
    enabled: bool = True
    match_models: list[str] = Field(default_factory=list, description="Applies to requests routed to these models.")
    variants: list[Variant] = Field(default_factory=list)
    shadow_model: str | None = None
    shadow_version: str | None = Field(default=None, description="The shadow copies' version of shadow_model.")
    shadow_share: float = Field(default=0.0, ge=0.0, le=1.0)
    shadow_reply_topic: str = "llm.shadow"
    updated_at_ms: int = Field(default_factory=now_ms)
    version: int = Field(
        default=0,
        ge=0,
        description="Monotonic: each change is the version its writer read + 1, written only if no other "
        "change came after that read (compare-and-set); readers keep the highest version, not the last record.",
    )
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
    # A release (llmbus models release): two versions of one model, control_model == candidate_model.
    upgrade_id: str | None = Field(default=None, description="Set on a release; the experiment id is the same")
    control_version: str | None = None
    candidate_version: str | None = None

    @property
    def is_release(self) -> bool:
        return self.upgrade_id is not None and self.candidate_version is not None


class Feedback(Message):
    STRICT_INPUT: ClassVar[bool] = True  # client input: an unknown field is refused

    request_id: str
    tenant: str = "default"
    score: float = Field(ge=0.0, le=1.0)
    comment: str | None = None


class Comparison(Message):
    """On llm.comparisons (key: experiment id): one per joined primary/shadow pair.

    `comparison_id` (`<tenant>:<primary request id>:<experiment id>`: the primary's request key and
    the experiment) is the same on a redelivery, so a reader dedupes on it.
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
    release: ReleaseContext | None = Field(default=None, description="The candidate's (its shadow copy's) release.")


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
    release: ReleaseContext | None = Field(default=None, description="The pool's model's release at the time.")


class CostKind(StrEnum):
    HOSTED = "hosted"  # tokens x the provider's prices
    SELF_HOSTED = "self_hosted"  # a share of a worker's GPU time (+ its cold start, amortised)
    CACHE = "cache"  # served from the router's cache: costs 0, the saving is recorded
    IDLE = "idle"  # a worker's GPU time that served no request (booked to the platform)
    COLD_START_WASTE = "cold_start_waste"  # cold-start time no request paid for (reclaimed too early)
    UNPRICED = "unpriced"  # no price for the model/worker (costs 0; counted, never silent)
    NONE = "none"  # refused or failed before any tokens (costs 0)


class BookedTo(StrEnum):
    TENANT = "tenant"
    EXPERIMENT = "experiment"  # shadow traffic: the experiment pays, never the tenant
    PLATFORM = "platform"  # idle and wasted cold-start GPU time


# Costs of a worker's time, not of a request: no model answered, no tokens were used.
WORKER_TIME_KINDS = frozenset({CostKind.IDLE, CostKind.COLD_START_WASTE})


class CostRecord(WithGenAi):
    """On llm.costs (key: record id): one per result on llm.results, plus one per closed idle interval.

    Money is exact in `*_micro_usd` (integer micro-dollars, rounding half to even once per
    product); the float `*_usd` fields are for display.
    """

    request_id: str
    tenant: str
    model: str
    cost_usd: float
    experiment_id: str | None = None
    cached_saving_usd: float = 0.0
    record_id: str = Field(
        default="",
        description="Dedupe key: the request's key `<tenant>:<request id>` (unique across tenants), "
        "`<request key>#leg<n>` for leg n of a continued answer billed apart, or idle:<worker>:<interval start>.",
    )
    leg: int | None = Field(
        default=None,
        ge=0,
        description="A continued answer is billed per leg (InferenceResult.legs): this record prices its leg `leg` "
        "(0-based) alone, one of the legs before its last; None: the answer's own record (its last leg, or the "
        "whole answer), the one that counts the request.",
    )
    kind: CostKind = CostKind.HOSTED
    booked_to: BookedTo = BookedTo.TENANT
    cost_micro_usd: int = 0
    cold_start_micro_usd: int = Field(default=0, description="Part of cost_micro_usd that amortises cold start.")
    cold_start_phases_s: dict[str, float] = Field(
        default_factory=dict,
        description="cold_start_waste: the instance's cold start by phase, as its heartbeat reported it"
        " (WorkerStatus.cold_start_phases_s: weights, kv_pool, kernels, warmup, ...).",
    )
    saving_micro_usd: int = Field(default=0, description="Cache hits: what the model would have cost.")
    output_cap_saving_micro_usd: int = Field(
        default=0,
        description="Upper bound of what the router's output cap avoided: the answer stopped at the cap, and the "
        "tokens between it and the client's max_tokens at the model's list output price.",
    )
    baseline_micro_usd: int | None = Field(
        default=None, description="Savings baseline: the untrimmed, uncached request on the default model."
    )
    list_price_micro_usd: int | None = Field(default=None, description="The same tokens at the model's list price.")
    variant: str | None = None
    shadow: bool = False
    route_reason: str | None = None
    # The result's request facts (InferenceResult), so costs are analysed by session, user, category, tier alone.
    session_id: str | None = None
    user_id: str | None = Field(default=None, description="As on the result: hashed where the tenant asks.")
    category: str | None = None
    tier: str | None = None
    pool: str | None = None
    worker_id: str | None = None
    gpu: str | None = None
    capacity: str | None = None
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    trimmed_prompt_tokens: int = 0
    gpu_busy_ms: float = 0.0
    booked_at_ms: int = Field(default_factory=now_ms, description="When the cost happened (result or interval).")
    release: ReleaseContext | None = Field(default=None, description="As on the result.")

    @property
    def prices_a_result(self) -> bool:
        """The record prices one result (one per request); idle and wasted worker time price none."""
        return self.kind not in WORKER_TIME_KINDS

    def gen_ai_attributes(self) -> dict[str, Any] | None:
        if not self.prices_a_result:
            return None
        return gen_ai_object(
            model=self.model,
            input_tokens=self.prompt_tokens,
            output_tokens=self.completion_tokens,
            cached_input_tokens=self.cached_prompt_tokens,
            session_id=self.session_id,
        )


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
    period_key: str | None = Field(default=None, description="e.g. 2026-11 or 2026-11-30 (UTC)")
    threshold_perc: int | None = Field(default=None, description="The alert threshold just crossed (50, 80, 100).")


class DeadLetter(Message):
    """On llm.dlq (key: the original key, bounded): the raw bytes and why they could not be handled.

    The raw key and value are cut to a bound (`raw_truncated` says so; the sizes are the
    originals'): source topic, partition and offset find the whole record in its topic.
    """

    source_topic: str
    source_partition: int
    source_offset: int
    raw_key_b64: str | None = None
    raw_value_b64: str
    raw_key_size_bytes: int | None = None
    raw_value_size_bytes: int = 0
    raw_truncated: bool = False
    error_code: str
    error: str
    service: str
    request_id: str | None = None
    failed_at_ms: int = Field(default_factory=now_ms)
