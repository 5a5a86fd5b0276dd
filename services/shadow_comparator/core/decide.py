"""The decision loop's verdict for one experiment: promote (ramp one step), hold, or rollback.

Rules, in order:
 1. an ended experiment gets no verdict;
 2. rollback at once when a guardrail breaks. The loop looks every tick, so a guardrail breaks
    only on evidence that stays valid under peeking: once the step has `min_samples`, an
    always-valid confidence bound (the mixture confidence sequence of core/sequential.py) past the
    limit -- the candidate's error rate's lower bound above `max_error_rate`, similarity's upper
    bound below its floor, ... -- and for p95 latency the point regression over the limit *and*
    the always-valid test showing the candidate slower. The guardrails share `alpha` (each gets
    alpha / their number), so an identical candidate is rolled back in at most alpha of runs
    however often it is looked at; point estimates checked every tick rolled one back in 21-53 %
    of A/A runs;
 3. promote (next step) when the experiment runs, ramps automatically, the step has
    `min_samples_per_step` candidate samples (and at least the guardrails' `min_samples`, so every
    guardrail was evaluated) of which some are answers (a candidate that produced only errors, or
    nothing, is not healthy) and `min_step_s` seconds, and the guardrails hold;
 4. hold otherwise, saying what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmbus.contract.messages import (
    Experiment,
    ExperimentDecision,
    ExperimentState,
    StatEvidence,
    VariantEvidence,
)
from llmbus.domain.lifecycle import CANDIDATE, ENDED, render, share_pct
from llmbus.domain.release import context_for
from llmbus_services.shadow_comparator.core.aggregates import PairStats, VariantStats
from llmbus_services.shadow_comparator.core.sequential import (
    Moments,
    SequentialResult,
    msprt,
    msprt_means,
    msprt_proportions,
)

# Mixture scales: the effect sizes the tests are tuned to find (see core/sequential.py).
TAU_PROPORTION = 0.05
TAU_LOG_LATENCY = 0.1


@dataclass
class StepEvidence:
    """What the store holds for the experiment's current step."""

    pairs: PairStats | None = None  # shadow step
    control: VariantStats | None = None  # A/B steps
    candidate: VariantStats | None = None


@dataclass
class Verdict:
    decision: ExperimentDecision
    updated: Experiment | None  # to publish on llm.experiments; None: unchanged
    breaches: list[str] = field(default_factory=list)


# Checks that can roll back an A/B step (error rate, p95, negative feedback, early error test) and a
# shadow step (error rate, similarity, format failures, p95, early error test): alpha is split among them.
AB_CHECKS = 4
SHADOW_CHECKS = 5
TAU_SIMILARITY = 0.1


def _rate_above(events: int, n: int, ceiling: float, alpha: float) -> bool:
    """The rate's always-valid lower confidence bound is above `ceiling` (n >= 1)."""
    p = (events + 0.5) / (n + 1)  # smoothed: the variance stays off zero before any event
    return msprt(events / n - ceiling, p * (1 - p) / n, TAU_PROPORTION, alpha).ci_low > 0


# A sample variance of 0 (every value alike) would make the bounds infinitely wide (msprt treats
# no variance as no evidence): a floor of a 1 % standard deviation per observation.
MIN_VAR = 1e-4


def _mean_below(m: Moments, floor: float, alpha: float) -> bool:
    """The mean's always-valid upper confidence bound is below `floor`."""
    return m.n >= 2 and msprt(m.mean - floor, max(m.var, MIN_VAR) / m.n, TAU_SIMILARITY, alpha).ci_high < 0


def _evidence(test: SequentialResult, metric: str) -> StatEvidence:
    return StatEvidence(
        metric=metric,
        estimate=round(test.estimate, 6),
        ci_low=round(max(test.ci_low, -1e9), 6),
        ci_high=round(min(test.ci_high, 1e9), 6),
        p_value=round(test.p_value, 6),
    )


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def _variant(name: str, model: str, s: VariantStats) -> VariantEvidence:
    return VariantEvidence(
        variant=name,
        model=model,
        samples=s.n,
        error_rate=_round(s.error_rate),
        completion_rate=_round(s.completion_rate),
        p50_ms=_round(s.latency.percentile(50), 1),
        p95_ms=_round(s.latency.percentile(95), 1),
        p99_ms=_round(s.latency.percentile(99), 1),
        cost_per_request_usd=_round(s.cost_per_request_usd, 8),
        feedback_samples=s.feedback_n,
        negative_feedback_rate=_round(s.negative_feedback_rate),
    )


def _p95_regression(control_p95: float | None, candidate_p95: float | None) -> float | None:
    if not control_p95 or candidate_p95 is None:
        return None
    return candidate_p95 / control_p95 - 1.0


def _shadow_checks(
    experiment: Experiment, p: PairStats
) -> tuple[list[str], list[str], list[VariantEvidence], list[StatEvidence], int]:
    g = experiment.guardrails
    alpha = g.alpha
    each = alpha / SHADOW_CHECKS
    breaches: list[str] = []
    early: list[str] = []
    ctrl_p95, cand_p95 = p.control_latency.percentile(95), p.candidate_latency.percentile(95)
    errors = msprt_proportions(p.control_errors, p.n, p.candidate_errors, p.n, TAU_PROPORTION, each)
    d = p.log_latency_delta
    latency = msprt(d.mean, d.var / d.n, TAU_LOG_LATENCY, alpha) if d.n >= 2 else msprt(0.0, 0.0, 1.0, alpha)
    tests = [_evidence(errors, "error_rate"), _evidence(latency, "log_latency_paired")]
    if p.n >= g.min_samples:
        rate = p.candidate_error_rate
        if rate is not None and _rate_above(p.candidate_errors, p.n, g.max_error_rate, each):
            breaches.append(f"candidate error rate {rate:.3f} > {g.max_error_rate} (always-valid bound)")
        sim = p.similarity_mean
        if sim is not None and _mean_below(p.similarity, g.min_similarity, each):
            breaches.append(f"similarity {sim:.3f} < floor {g.min_similarity} (always-valid bound)")
        fmt = p.format_failure_rate
        if fmt is not None and _rate_above(p.candidate_format_failures, p.n, g.max_format_failure_rate, each):
            breaches.append(f"format failures {fmt:.3f} > {g.max_format_failure_rate} (always-valid bound)")
        reg = _p95_regression(ctrl_p95, cand_p95)
        slower = msprt(d.mean, max(d.var, MIN_VAR) / d.n, TAU_LOG_LATENCY, each) if d.n >= 2 else None
        if reg is not None and reg > g.max_p95_regression and slower and slower.rejects(each) and d.mean > 0:
            breaches.append(f"p95 latency +{reg:.0%} > +{g.max_p95_regression:.0%}")
    if errors.rejects(each) and errors.ci_low > g.max_error_rate_increase:
        early.append(f"error rate higher by {errors.estimate:+.3f} (always-valid p={errors.p_value:.4f})")
    variants = [
        VariantEvidence(
            variant="control",
            model=experiment.control_model or "",
            samples=p.n,
            error_rate=_round(p.control_error_rate),
            p50_ms=_round(p.control_latency.percentile(50), 1),
            p95_ms=_round(ctrl_p95, 1),
            p99_ms=_round(p.control_latency.percentile(99), 1),
        ),
        VariantEvidence(
            variant="candidate(shadow)",
            model=experiment.candidate_model or "",
            samples=p.n,
            error_rate=_round(p.candidate_error_rate),
            p50_ms=_round(p.candidate_latency.percentile(50), 1),
            p95_ms=_round(cand_p95, 1),
            p99_ms=_round(p.candidate_latency.percentile(99), 1),
            similarity_mean=_round(p.similarity_mean),
            format_failure_rate=_round(p.format_failure_rate),
        ),
    ]
    # Pairs where either side failed carry no similarity: only pairs with both answers count as evidence.
    return breaches, early, variants, tests, min(p.n, p.similarity.n)


def _ab_checks(
    experiment: Experiment, c: VariantStats, k: VariantStats
) -> tuple[list[str], list[str], list[VariantEvidence], list[StatEvidence], int]:
    g = experiment.guardrails
    alpha = g.alpha
    each = alpha / AB_CHECKS
    breaches: list[str] = []
    early: list[str] = []
    errors = msprt_proportions(c.errors, c.n, k.errors, k.n, TAU_PROPORTION, each)
    completion = msprt_proportions(c.stopped, c.n, k.stopped, k.n, TAU_PROPORTION, alpha)
    latency = msprt_means(c.log_latency, k.log_latency, TAU_LOG_LATENCY, alpha)
    tests = [
        _evidence(errors, "error_rate"),
        _evidence(completion, "completion_rate"),
        _evidence(latency, "log_latency"),
    ]
    if c.feedback_n and k.feedback_n:
        negative = msprt_proportions(
            c.feedback_negative, c.feedback_n, k.feedback_negative, k.feedback_n, TAU_PROPORTION, alpha
        )
        tests.append(_evidence(negative, "negative_feedback_rate"))
    ctrl_p95, cand_p95 = c.latency.percentile(95), k.latency.percentile(95)
    if k.n >= g.min_samples:
        if (rate := k.error_rate) is not None and _rate_above(k.errors, k.n, g.max_error_rate, each):
            breaches.append(f"candidate error rate {rate:.3f} > {g.max_error_rate} (always-valid bound)")
        reg = _p95_regression(ctrl_p95, cand_p95)
        slower = msprt_means(c.log_latency, k.log_latency, TAU_LOG_LATENCY, each)
        if (
            c.n >= g.min_samples
            and reg is not None
            and reg > g.max_p95_regression
            and slower.rejects(each)
            and slower.estimate > 0
        ):
            breaches.append(f"p95 latency +{reg:.0%} > +{g.max_p95_regression:.0%}")
    neg = k.negative_feedback_rate
    if (
        k.feedback_n >= g.min_samples
        and neg is not None
        and _rate_above(k.feedback_negative, k.feedback_n, g.max_negative_feedback_rate, each)
    ):
        breaches.append(f"negative feedback {neg:.3f} > {g.max_negative_feedback_rate} (always-valid bound)")
    if errors.rejects(each) and errors.ci_low > g.max_error_rate_increase:
        early.append(f"error rate higher by {errors.estimate:+.3f} (always-valid p={errors.p_value:.4f})")
    variants = [
        _variant("control", experiment.control_model or "", c),
        _variant("candidate", experiment.candidate_model or "", k),
    ]
    return breaches, early, variants, tests, k.n


def decide(experiment: Experiment, evidence: StepEvidence, now_ms: int) -> Verdict | None:
    if experiment.state in ENDED or experiment.ramp is None:
        return None
    steps = experiment.ramp.steps_pct
    share_now = share_pct(experiment)
    if evidence.pairs is not None and share_now <= 0:
        breaches, early, variants, tests, samples = _shadow_checks(experiment, evidence.pairs)
    elif evidence.control is not None and evidence.candidate is not None:
        breaches, early, variants, tests, samples = _ab_checks(experiment, evidence.control, evidence.candidate)
    else:
        return None

    def verdict(kind: str, reasons: list[str], updated: Experiment | None) -> Verdict:
        after = updated or experiment
        return Verdict(
            ExperimentDecision(
                experiment_id=experiment.experiment_id,
                decision=kind,  # type: ignore[arg-type]
                reasons=reasons,
                step_from=experiment.step,
                step_to=after.step,
                share_from_pct=share_now,
                share_to_pct=share_pct(after),
                state=after.state,
                variants=variants,
                tests=tests,
                release=context_for(experiment, CANDIDATE),  # the stage the evidence is from
            ),
            updated,
            breaches + early,
        )

    if breaches or early:
        rolled = render(
            experiment.model_copy(update={"state": ExperimentState.ROLLED_BACK, "note": "; ".join(breaches + early)})
        )
        return verdict("rollback", breaches + early, rolled)

    plan = experiment.ramp
    missing = []
    if experiment.state != ExperimentState.RUNNING:
        missing.append(f"state {experiment.state.value}")
    if not plan.auto:
        missing.append("ramp is manual")
    # A guardrail that has not been evaluated has not held: ramp only past its sample floor too.
    needed = max(plan.min_samples_per_step, experiment.guardrails.min_samples)
    if samples < needed:
        missing.append(f"{samples}/{needed} samples at this step")
    if evidence.pairs is None and evidence.candidate is not None and evidence.candidate.ok == 0:
        missing.append("no answer from the candidate's model at this step")
    held_s = (now_ms - experiment.step_started_at_ms) / 1000
    if held_s < plan.min_step_s:
        missing.append(f"{held_s:.0f}/{plan.min_step_s:.0f} s at this step")
    if missing or experiment.step >= len(steps) - 1:
        return verdict("hold", ["guardrails hold", *missing], None)
    nxt = experiment.step + 1
    promoted = ExperimentState.PROMOTED if nxt == len(steps) - 1 and steps[nxt] >= 100 else experiment.state
    ramped = render(
        experiment.model_copy(
            update={"step": nxt, "state": promoted, "step_started_at_ms": now_ms, "note": f"ramped to {steps[nxt]} %"}
        )
    )
    return verdict("promote", [f"guardrails hold over {samples} samples; ramp {share_now} -> {steps[nxt]} %"], ramped)


__all__ = ["Moments", "StepEvidence", "Verdict", "decide"]
