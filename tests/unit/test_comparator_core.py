"""shadow-comparator core: pair metrics, the mergeable histogram, the lifecycle and the decision rules."""

from __future__ import annotations

import random

import numpy as np
import pytest

from llmbus.contract.messages import (
    ErrorCode,
    ErrorInfo,
    Experiment,
    ExperimentState,
    FinishReason,
    Guardrails,
    InferenceResult,
    RampPlan,
    ResultStatus,
    Timings,
    Usage,
)
from llmbus.domain.lifecycle import (
    LifecycleError,
    create,
    render,
    share_pct,
    step_for_share,
    to_step,
    with_state,
)
from llmbus_services.router.core.experiments import pick_variant
from llmbus_services.shadow_comparator.core.aggregates import (
    PairStats,
    VariantStats,
    pair_increments,
    variant_increments,
)
from llmbus_services.shadow_comparator.core.compare import compare, rouge_l_f1
from llmbus_services.shadow_comparator.core.decide import StepEvidence, decide
from llmbus_services.shadow_comparator.core.join import pair_ref
from llmbus_services.shadow_comparator.core.sketch import GROWTH, LatencyHistogram


def result(
    rid: str,
    text: str = "a b c d",
    *,
    ok: bool = True,
    total_ms: float = 100.0,
    ttft_ms: float = 20.0,
    tokens: int = 4,
    shadow: bool = False,
    finish: FinishReason = FinishReason.STOP,
    experiment_id: str | None = None,
    variant: str | None = None,
) -> InferenceResult:
    return InferenceResult(
        request_id=rid,
        tenant="t",
        status=ResultStatus.OK if ok else ResultStatus.ERROR,
        error=None if ok else ErrorInfo.of(ErrorCode.ENGINE_FAILED, "boom"),
        model="cand" if shadow else "ctrl",
        text=text if ok else "",
        finish_reason=finish if ok else FinishReason.ERROR,
        usage=Usage(completion_tokens=tokens),
        timings=Timings(ttft_ms=ttft_ms, total_ms=total_ms),
        shadow=shadow,
        experiment_id=experiment_id,
        variant=variant,
    )


# --- pair metrics -----------------------------------------------------------------------------


def test_rouge_l_is_one_for_equal_zero_for_disjoint_and_in_between_otherwise() -> None:
    assert rouge_l_f1("the cat sat", "the cat sat") == 1.0
    assert rouge_l_f1("the cat sat", "dogs run fast") == 0.0
    assert rouge_l_f1("the cat sat on the mat", "the cat lay on the mat") == pytest.approx(5 / 6)
    assert rouge_l_f1("", "") == 1.0 and rouge_l_f1("x", "") == 0.0


def test_comparison_deltas_similarity_and_identity() -> None:
    primary = result("r1", "the cat sat", total_ms=100, ttft_ms=20, tokens=3)
    shadow = result("r1.shadow.e1", "the cat sat down", total_ms=160, ttft_ms=50, tokens=4, shadow=True)
    c = compare("e1", primary, shadow)
    assert c.comparison_id == "t:r1:e1" and c.request_id == "r1"
    assert c.total_delta_ms == 60 and c.ttft_delta_ms == 30 and c.length_delta_tokens == 1
    assert 0.8 < c.similarity < 1.0  # type: ignore[operator]
    assert c.control.error_class == "ok" and c.candidate.model == "cand"


def test_format_checks_json_empty_truncated_refusal_and_error_classes() -> None:
    primary = result("r", '{"answer": 42}')
    bad_json = compare("e", primary, result("r.shadow.e", '{"answer": 4', shadow=True))
    assert bad_json.candidate.format.json_expected and bad_json.candidate.format.json_valid is False
    assert bad_json.candidate.format.failed and not bad_json.control.format.failed
    good = compare("e", primary, result("r.shadow.e", '{"answer": 41}', shadow=True))
    assert good.candidate.format.json_valid is True and not good.candidate.format.failed
    refusal = compare("e", result("r", "sure"), result("r.shadow.e", "I'm sorry, but I can't", shadow=True))
    assert refusal.candidate.format.refusal and not refusal.candidate.format.json_expected
    empty = compare("e", result("r", "x"), result("r.shadow.e", "  ", shadow=True, finish=FinishReason.LENGTH))
    assert empty.candidate.format.empty and empty.candidate.format.truncated
    failed = compare("e", result("r"), result("r.shadow.e", ok=False, shadow=True))
    assert failed.candidate.error_class == "engine_failed" and failed.similarity is None


def test_pair_ref_parses_the_routers_shadow_ids() -> None:
    assert pair_ref(result("abc.shadow.exp-1", shadow=True)) == pair_ref(result("abc.shadow.exp-1", shadow=True))
    ref = pair_ref(result("abc.shadow.exp-1", shadow=True))
    assert ref is not None and (ref.primary_key, ref.experiment_id, ref.field) == ("t:abc", "exp-1", "s:exp-1")
    primary = pair_ref(result("abc"))
    assert primary is not None and primary.field == "p" and primary.experiment_id is None
    assert pair_ref(result("0123456789abcdef.shadow", shadow=True)) is None  # hashed: cannot be joined


# --- mergeable aggregates --------------------------------------------------------------------


def test_histogram_percentiles_within_bin_error_and_merge_is_addition() -> None:
    rng = np.random.default_rng(0)
    values = rng.lognormal(5.0, 0.7, 20_000)
    a, b = LatencyHistogram.of(values[:7000]), LatencyHistogram.of(values[7000:])
    merged = a.merge(b)
    assert merged.counts == LatencyHistogram.of(values).counts
    for q in (50, 95, 99):
        exact = float(np.percentile(values, q))
        assert abs(merged.percentile(q) / exact - 1) <= GROWTH - 1 + 1e-9  # type: ignore[operator]
    assert LatencyHistogram().percentile(95) is None


def test_variant_aggregates_are_sums_that_read_back() -> None:
    fields: dict[str, float] = {}
    rows = [result(f"r{i}", total_ms=100 + i, ok=i % 10 != 0) for i in range(100)]
    for r in rows:
        for k, v in variant_increments(r).items():
            fields[k] = fields.get(k, 0.0) + v
    stats = VariantStats.from_fields(fields)
    assert stats.n == 100 and stats.errors == 10 and stats.error_rate == pytest.approx(0.1)
    assert stats.completion_rate == pytest.approx(0.9)
    assert stats.latency.total == 90 and 140 < stats.latency.percentile(50) < 160  # type: ignore[operator]


def test_pair_aggregates_read_back() -> None:
    fields: dict[str, float] = {}
    for i in range(10):
        c = compare("e", result(f"r{i}", "a b c d"), result(f"r{i}.shadow.e", "a b x y", shadow=True, total_ms=200))
        for k, v in pair_increments(c).items():
            fields[k] = fields.get(k, 0.0) + v
    stats = PairStats.from_fields(fields)
    assert stats.n == 10 and stats.similarity_mean == pytest.approx(0.5)
    assert stats.log_latency_delta.mean == pytest.approx(np.log(2.0))


# --- lifecycle ------------------------------------------------------------------------------


def test_render_walks_shadow_to_ab_to_full_and_the_router_follows() -> None:
    exp = create("e1", "ctrl", "cand", shadow_share=0.5)
    assert exp.kind == "shadow" and exp.shadow_model == "cand" and exp.shadow_share == 0.5
    assert exp.match_models == ["ctrl"] and share_pct(exp) == 0
    users = [f"u{i}" for i in range(4000)]
    for step, pct in enumerate([1, 5, 25, 50]):
        exp = to_step(exp, step + 1)
        assert exp.kind == "ab" and share_pct(exp) == pct
        on_candidate = sum(pick_variant(exp, u)[1] == "cand" for u in users)  # type: ignore[index]
        assert abs(on_candidate / len(users) - pct / 100) < 0.02
    exp = to_step(exp, step_for_share(exp, 100))
    assert exp.state == ExperimentState.PROMOTED
    assert all(pick_variant(exp, u) == ("candidate", "cand") for u in users[:200])


def test_stop_and_rollback_disable_the_candidate_and_end_the_experiment() -> None:
    exp = to_step(create("e1", "ctrl", "cand"), 2)
    stopped = with_state(exp, ExperimentState.STOPPED)
    assert not stopped.enabled and share_pct(stopped) == 0
    with pytest.raises(LifecycleError):
        to_step(stopped, 3)
    with pytest.raises(LifecycleError):
        step_for_share(exp, 7)
    with pytest.raises(LifecycleError):
        create("e", "m", "m")
    paused = with_state(exp, ExperimentState.PAUSED)
    assert paused.enabled and share_pct(paused) == 5  # a pause freezes the split, it does not undo it


def test_plain_experiments_are_left_as_written() -> None:
    plain = Experiment(experiment_id="x", kind="shadow", shadow_model="m", shadow_share=0.1)
    assert render(plain) == plain


# --- decisions ------------------------------------------------------------------------------


def _pairs(n: int, *, similar: bool = True, slow: float = 1.0, errors: int = 0) -> StepEvidence:
    fields: dict[str, float] = {}
    rng = random.Random(1)
    for i in range(n):
        lat = rng.uniform(80, 120)
        c = compare(
            "e",
            result(f"r{i}", "a b c d", total_ms=lat),
            result(
                f"r{i}.shadow.e",
                "a b c d" if similar else "w x y z",
                total_ms=lat * slow,
                shadow=True,
                ok=i >= errors,
            ),
        )
        for k, v in pair_increments(c).items():
            fields[k] = fields.get(k, 0.0) + v
    return StepEvidence(pairs=PairStats.from_fields(fields))


def _ab(n: int, cand_error_every: int = 0, cand_slow: float = 1.0) -> StepEvidence:
    out = []
    for name, slow, err_every in (("control", 1.0, 0), ("candidate", cand_slow, cand_error_every)):
        fields: dict[str, float] = {}
        for i in range(n):
            r = result(f"{name}{i}", total_ms=100 * slow + i % 7, ok=not (err_every and i % err_every == 0))
            for k, v in variant_increments(r).items():
                fields[k] = fields.get(k, 0.0) + v
        out.append(VariantStats.from_fields(fields))
    return StepEvidence(control=out[0], candidate=out[1])


PLAN = RampPlan(min_samples_per_step=50, min_step_s=0)


def test_shadow_that_holds_is_promoted_to_the_first_ab_step_with_its_evidence() -> None:
    exp = create("e", "ctrl", "cand", ramp=PLAN)
    verdict = decide(exp, _pairs(60), now_ms=exp.step_started_at_ms)
    assert verdict is not None and verdict.decision.decision == "promote"
    assert verdict.updated is not None and share_pct(verdict.updated) == 1.0 and verdict.updated.kind == "ab"
    assert {v.variant for v in verdict.decision.variants} == {"control", "candidate(shadow)"}
    assert verdict.decision.tests and verdict.decision.share_to_pct == 1.0


@pytest.mark.parametrize(
    ("evidence", "reason"),
    [
        (_pairs(60, similar=False), "similarity"),
        (_pairs(60, slow=2.0), "p95 latency"),
        # a breach is evidence that stays valid under peeking: 20 % errors over 400 pairs, not 60
        (_pairs(400, errors=80), "error rate"),
    ],
)
def test_a_broken_shadow_guardrail_rolls_back_at_once(evidence: StepEvidence, reason: str) -> None:
    exp = create("e", "ctrl", "cand", ramp=PLAN)
    verdict = decide(exp, evidence, now_ms=exp.step_started_at_ms)
    assert verdict is not None and verdict.decision.decision == "rollback"
    assert any(reason in r for r in verdict.decision.reasons), verdict.decision.reasons
    assert verdict.updated is not None and verdict.updated.state == ExperimentState.ROLLED_BACK
    assert not verdict.updated.enabled


def test_hold_until_enough_samples_and_time_then_ramp_ab_then_promote_at_100() -> None:
    exp = to_step(create("e", "ctrl", "cand", ramp=RampPlan(min_samples_per_step=50, min_step_s=30)), 3)
    early = decide(exp, _ab(20), now_ms=exp.step_started_at_ms + 60_000)
    assert early is not None and early.decision.decision == "hold" and early.updated is None
    too_soon = decide(exp, _ab(60), now_ms=exp.step_started_at_ms + 1_000)
    assert too_soon is not None and too_soon.decision.decision == "hold"
    ramp = decide(exp, _ab(60), now_ms=exp.step_started_at_ms + 60_000)
    assert ramp is not None and ramp.decision.decision == "promote" and share_pct(ramp.updated) == 50  # type: ignore[arg-type]
    last = decide(ramp.updated, _ab(60), now_ms=ramp.updated.step_started_at_ms + 60_000)  # type: ignore[union-attr,arg-type]
    assert last is not None and last.updated is not None and last.updated.state == ExperimentState.PROMOTED
    assert decide(last.updated, _ab(60), now_ms=0) is None  # ended: no more verdicts


def test_ab_candidate_with_errors_or_slowness_is_rolled_back() -> None:
    exp = to_step(create("e", "ctrl", "cand", ramp=PLAN), 2)
    errors = decide(exp, _ab(200, cand_error_every=5), now_ms=exp.step_started_at_ms)
    assert errors is not None and errors.decision.decision == "rollback"
    slow = decide(exp, _ab(200, cand_slow=1.6), now_ms=exp.step_started_at_ms)
    assert slow is not None and slow.decision.decision == "rollback"
    assert any("p95" in r for r in slow.decision.reasons)


def test_paused_experiment_never_ramps_but_still_rolls_back() -> None:
    exp = with_state(to_step(create("e", "ctrl", "cand", ramp=PLAN), 1), ExperimentState.PAUSED)
    hold = decide(exp, _ab(200), now_ms=exp.step_started_at_ms + 10**6)
    assert hold is not None and hold.decision.decision == "hold"
    roll = decide(exp, _ab(200, cand_error_every=4), now_ms=exp.step_started_at_ms)
    assert roll is not None and roll.decision.decision == "rollback"


def test_no_ramp_before_the_guardrails_could_be_evaluated() -> None:
    exp = create("e", "ctrl", "cand", ramp=RampPlan(min_samples_per_step=2, min_step_s=0))  # guardrails: 30
    verdict = decide(exp, _pairs(10, similar=False), now_ms=exp.step_started_at_ms)
    assert verdict is not None and verdict.decision.decision == "hold"
    assert any("10/30 samples" in r for r in verdict.decision.reasons)


def test_pairs_without_both_answers_are_no_evidence_for_a_ramp() -> None:
    exp = create("e", "ctrl", "cand", ramp=PLAN, guardrails=Guardrails(min_samples=10, max_error_rate=1.0))
    fields: dict[str, float] = {}
    for i in range(60):  # the control failed every time: nothing to compare the candidate's answers with
        c = compare("e", result(f"r{i}", ok=False), result(f"r{i}.shadow.e", "w x y z", shadow=True))
        for k, v in pair_increments(c).items():
            fields[k] = fields.get(k, 0.0) + v
    verdict = decide(exp, StepEvidence(pairs=PairStats.from_fields(fields)), now_ms=exp.step_started_at_ms)
    assert verdict is not None and verdict.decision.decision == "hold"


def test_guardrails_are_configurable() -> None:
    lax = Guardrails(min_similarity=0.0, min_samples=10)
    exp = create("e", "ctrl", "cand", ramp=PLAN, guardrails=lax)
    verdict = decide(exp, _pairs(60, similar=False), now_ms=exp.step_started_at_ms)
    assert verdict is not None and verdict.decision.decision == "promote"
