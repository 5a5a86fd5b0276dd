"""The guardrails under peeking: seeded A/A and A/B simulations through `decide` itself (pure core).

Each run draws both arms' samples up front and asks the decision loop for a verdict every
`LOOK_EVERY` samples (on the growing prefix) from the guardrails' `min_samples` on, as the loop's ticks would;
a run counts as rolled back at its first rollback verdict. The pass criteria were fixed before
the first run: an identical candidate is rolled back in at most 5 % of 200 runs, a candidate with
50 % more errors in at least 90 % of 200 runs. Point-estimate guardrails checked this way rolled an
identical candidate back in 21-53 % of A/A runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from llmbus.contract.messages import Guardrails, RampPlan
from llmbus.domain.lifecycle import create, to_step
from llmbus_services.shadow_comparator.core.aggregates import PairStats, VariantStats
from llmbus_services.shadow_comparator.core.decide import StepEvidence, decide
from llmbus_services.shadow_comparator.core.sequential import Moments
from llmbus_services.shadow_comparator.core.sketch import _LOG_GROWTH, MIN_MS, LatencyHistogram

RUNS = 200
N_MAX = 10_000  # samples per arm in a run (one ramp step's worth of traffic)
LOOK_EVERY = 250
BASE_ERROR_RATE = 0.08
GUARDRAILS = Guardrails(max_error_rate=0.10, max_error_rate_increase=0.02, min_samples=30)
# Ramping never happens here (the step's sample floor is out of reach): only rollbacks are counted.
EXPERIMENT = to_step(
    create("aa", "ctrl", "cand", ramp=RampPlan(min_samples_per_step=10**9, min_step_s=0), guardrails=GUARDRAILS), 2
)
LOG_MS_MEAN, LOG_MS_SD = math.log(800.0), 0.6


LOOKS = [GUARDRAILS.min_samples, *range(LOOK_EVERY, N_MAX + 1, LOOK_EVERY)]


def _upto(values: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """At each look: the count of kept samples, or the sum of `values` over the kept samples, so far."""
    kept = values if keep is None else np.where(keep, values, 0)
    return np.cumsum(kept)[np.asarray(LOOKS) - 1]


def _bin_of(log_ms: np.ndarray) -> np.ndarray:
    return np.floor((log_ms - math.log(MIN_MS)) / _LOG_GROWTH).astype(int)


def _hists_upto(log_ms: np.ndarray, keep: np.ndarray) -> Iterator[dict[int, int]]:
    """At each look: the latency histogram's bins (as the store holds them) of the kept samples so far."""
    bins = _bin_of(log_ms)
    low = int(bins.min())
    counts = np.zeros(int(bins.max()) - low + 1, dtype=np.int64)
    done = 0
    for look in LOOKS:
        counts += np.bincount(bins[done:look][keep[done:look]] - low, minlength=len(counts))
        done = look
        filled = np.flatnonzero(counts)
        yield dict(zip((filled + low).tolist(), counts[filled].tolist(), strict=True))


def _arm_stats(errors: np.ndarray, log_ms: np.ndarray) -> Iterator[VariantStats]:
    """One arm's running aggregates at each look, as the store would hold them."""
    ok = ~errors
    n_errors, lat_n = _upto(errors.astype(np.int64)), _upto(ok.astype(np.int64))
    lat_sum, lat_sq = _upto(log_ms, ok), _upto(log_ms * log_ms, ok)
    for i, (look, bins) in enumerate(zip(LOOKS, _hists_upto(log_ms, ok), strict=True)):
        yield _variant(look, int(n_errors[i]), Moments(int(lat_n[i]), float(lat_sum[i]), float(lat_sq[i])), bins)


def _variant(n: int, errors: int, log_latency: Moments, bins: dict[int, int]) -> VariantStats:
    return VariantStats(
        n=n,
        ok=n - errors,
        errors=errors,
        stopped=n - errors,
        latency=LatencyHistogram(bins),
        ttft=LatencyHistogram(),
        log_latency=log_latency,
        cost_n=0,
        cost_usd=0.0,
        feedback_n=0,
        feedback_negative=0,
    )


def rolled_back_share(candidate_error_rate: float, seed: int) -> float:
    """Each run draws both arms' N_MAX samples at once; the looks see growing prefixes of them."""
    rng = np.random.default_rng(seed)
    rolled = 0
    for _ in range(RUNS):
        arms = [
            _arm_stats(rng.random(N_MAX) < rate, rng.normal(LOG_MS_MEAN, LOG_MS_SD, N_MAX))
            for rate in (BASE_ERROR_RATE, candidate_error_rate)
        ]
        for control, candidate in zip(*arms, strict=True):
            evidence = StepEvidence(control=control, candidate=candidate)
            verdict = decide(EXPERIMENT, evidence, EXPERIMENT.step_started_at_ms)
            assert verdict is not None
            if verdict.decision.decision == "rollback":
                rolled += 1
                break
    return rolled / RUNS


def test_an_identical_candidate_is_rarely_rolled_back_however_often_it_is_looked_at() -> None:
    share = rolled_back_share(BASE_ERROR_RATE, seed=7)
    print(f"A/A: rolled back in {share:.1%} of {RUNS} runs")
    assert share <= 0.05


def test_a_candidate_with_half_again_the_errors_is_rolled_back() -> None:
    share = rolled_back_share(BASE_ERROR_RATE * 1.5, seed=11)
    print(f"+50 % errors: rolled back in {share:.1%} of {RUNS} runs")
    assert share >= 0.90


def test_a_candidate_that_only_failed_is_not_promoted_even_where_no_guardrail_forbids_errors() -> None:
    lax = Guardrails(max_error_rate=1.0, max_error_rate_increase=1.0, min_samples=30)
    exp = to_step(create("e", "ctrl", "cand", ramp=RampPlan(min_samples_per_step=100, min_step_s=0), guardrails=lax), 2)
    one_bin = {int(_bin_of(np.array(LOG_MS_MEAN))): 300}
    all_ok = _variant(300, 0, Moments(300, 300 * LOG_MS_MEAN, 300 * LOG_MS_MEAN**2), one_bin)
    only_failed = _variant(300, 300, Moments(0, 0.0, 0.0), {})
    verdict = decide(exp, StepEvidence(control=all_ok, candidate=only_failed), exp.step_started_at_ms)
    assert verdict is not None and verdict.decision.decision == "hold" and verdict.updated is None
    assert any("no answer" in r for r in verdict.decision.reasons)


# --- shadow steps: the same criteria for pairs (control answer, candidate's shadow answer) -------
SHADOW_GUARDRAILS = GUARDRAILS.model_copy(update={"min_similarity": 0.5, "max_format_failure_rate": 0.10})
SHADOW = create(
    "sh", "ctrl", "cand", ramp=RampPlan(min_samples_per_step=10**9, min_step_s=0), guardrails=SHADOW_GUARDRAILS
)
FORMAT_FAILURE_RATE = 0.07
SIMILARITY_MEAN, SIMILARITY_SD = 0.6, 0.2


def shadow_rolled_back_share(candidate_error_rate: float, seed: int) -> float:
    """As `rolled_back_share`, for pairs (control answer, candidate's shadow answer)."""
    rng = np.random.default_rng(seed)
    rolled = 0
    for _ in range(RUNS):
        ctrl_err = rng.random(N_MAX) < BASE_ERROR_RATE
        cand_err = rng.random(N_MAX) < candidate_error_rate
        both = ~ctrl_err & ~cand_err
        sim = np.clip(rng.normal(SIMILARITY_MEAN, SIMILARITY_SD, N_MAX), 0.0, 1.0)
        ctrl_ms = rng.normal(LOG_MS_MEAN, LOG_MS_SD, N_MAX)
        cand_ms = rng.normal(LOG_MS_MEAN, LOG_MS_SD, N_MAX)
        fmt_fail = rng.random(N_MAX) < FORMAT_FAILURE_RATE
        d, cand_ok = cand_ms - ctrl_ms, ~cand_err
        ctrl_errors, cand_errors = _upto(ctrl_err.astype(np.int64)), _upto(cand_err.astype(np.int64))
        fmt_failures = _upto(fmt_fail.astype(np.int64))
        sim_n, sim_sum, sim_sq = _upto(both.astype(np.int64)), _upto(sim, both), _upto(sim * sim, both)
        d_n, d_sum, d_sq = _upto(cand_ok.astype(np.int64)), _upto(d, cand_ok), _upto(d * d, cand_ok)
        hists = zip(_hists_upto(ctrl_ms, cand_ok), _hists_upto(cand_ms, cand_ok), strict=True)
        for i, (look, (ctrl_bins, cand_bins)) in enumerate(zip(LOOKS, hists, strict=True)):
            pairs = PairStats(  # what PairStats.from_fields reads from the store's fields (tested on its own)
                n=look,
                control_errors=int(ctrl_errors[i]),
                candidate_errors=int(cand_errors[i]),
                candidate_format_failures=int(fmt_failures[i]),
                similarity=Moments(int(sim_n[i]), float(sim_sum[i]), float(sim_sq[i])),
                log_latency_delta=Moments(int(d_n[i]), float(d_sum[i]), float(d_sq[i])),
                control_latency=LatencyHistogram(ctrl_bins),
                candidate_latency=LatencyHistogram(cand_bins),
                ttft_delta_mean_ms=None,
            )
            verdict = decide(SHADOW, StepEvidence(pairs=pairs), SHADOW.step_started_at_ms)
            assert verdict is not None
            if verdict.decision.decision == "rollback":
                rolled += 1
                break
    return rolled / RUNS


def test_shadow_an_identical_candidate_is_rarely_rolled_back() -> None:
    share = shadow_rolled_back_share(BASE_ERROR_RATE, seed=23)
    print(f"shadow A/A: rolled back in {share:.1%} of {RUNS} runs")
    assert share <= 0.05


def test_shadow_a_candidate_with_half_again_the_errors_is_rolled_back() -> None:
    share = shadow_rolled_back_share(BASE_ERROR_RATE * 1.5, seed=29)
    print(f"shadow +50 % errors: rolled back in {share:.1%} of {RUNS} runs")
    assert share >= 0.90
