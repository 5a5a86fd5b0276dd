"""The guardrails under peeking: seeded A/A and A/B simulations through `decide` itself (pure core).

Each run streams both arms request by request and asks the decision loop for a verdict every
`LOOK_EVERY` candidate samples from the guardrails' `min_samples` on, as the loop's ticks would;
a run counts as rolled back at its first rollback verdict. The pass criteria were fixed before
the first run: an identical candidate is rolled back in at most 5 % of 200 runs, a candidate with
50 % more errors in at least 90 % of 200 runs. Point-estimate guardrails checked this way rolled an
identical candidate back in 21-53 % of A/A runs.
"""

from __future__ import annotations

import math

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


class Arm:
    """One arm's running aggregates, as the store would hold them."""

    def __init__(self) -> None:
        self.n = self.errors = 0
        self.lat_n, self.lat_sum, self.lat_sq = 0, 0.0, 0.0
        self.bins: dict[int, int] = {}

    def add(self, errors: np.ndarray, log_ms: np.ndarray) -> None:
        ok = ~errors
        self.n += len(errors)
        self.errors += int(errors.sum())
        lat = log_ms[ok]
        self.lat_n += len(lat)
        self.lat_sum += float(lat.sum())
        self.lat_sq += float((lat * lat).sum())
        bins = np.floor((lat - math.log(MIN_MS)) / _LOG_GROWTH).astype(int)
        for b, c in zip(*np.unique(bins, return_counts=True), strict=True):
            self.bins[int(b)] = self.bins.get(int(b), 0) + int(c)

    def stats(self) -> VariantStats:
        ok = self.n - self.errors
        return VariantStats(
            n=self.n,
            ok=ok,
            errors=self.errors,
            stopped=ok,
            latency=LatencyHistogram(self.bins),
            ttft=LatencyHistogram(),
            log_latency=Moments(self.lat_n, self.lat_sum, self.lat_sq),
            cost_n=0,
            cost_usd=0.0,
            feedback_n=0,
            feedback_negative=0,
        )


def rolled_back_share(candidate_error_rate: float, seed: int) -> float:
    rng = np.random.default_rng(seed)
    rolled = 0
    looks = [GUARDRAILS.min_samples, *range(LOOK_EVERY, N_MAX + 1, LOOK_EVERY)]
    for _ in range(RUNS):
        control, candidate = Arm(), Arm()
        done = 0
        for look in looks:
            for arm, rate in ((control, BASE_ERROR_RATE), (candidate, candidate_error_rate)):
                size = look - done
                arm.add(rng.random(size) < rate, rng.normal(LOG_MS_MEAN, LOG_MS_SD, size))
            done = look
            evidence = StepEvidence(control=control.stats(), candidate=candidate.stats())
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
    control, candidate = Arm(), Arm()
    control.add(np.zeros(300, dtype=bool), np.full(300, LOG_MS_MEAN))
    candidate.add(np.ones(300, dtype=bool), np.full(300, LOG_MS_MEAN))
    verdict = decide(exp, StepEvidence(control=control.stats(), candidate=candidate.stats()), exp.step_started_at_ms)
    assert verdict is not None and verdict.decision.decision == "hold" and verdict.updated is None
    assert any("no answer" in r for r in verdict.decision.reasons)


# --- shadow steps: the same criteria for pairs (control answer, candidate's shadow answer) -------
SHADOW_GUARDRAILS = GUARDRAILS.model_copy(update={"min_similarity": 0.5, "max_format_failure_rate": 0.10})
SHADOW = create(
    "sh", "ctrl", "cand", ramp=RampPlan(min_samples_per_step=10**9, min_step_s=0), guardrails=SHADOW_GUARDRAILS
)
FORMAT_FAILURE_RATE = 0.07
SIMILARITY_MEAN, SIMILARITY_SD = 0.6, 0.2


def _bins(log_ms: np.ndarray) -> dict[int, int]:
    bins = np.floor((log_ms - math.log(MIN_MS)) / _LOG_GROWTH).astype(int)
    return {int(b): int(c) for b, c in zip(*np.unique(bins, return_counts=True), strict=True)}


def shadow_rolled_back_share(candidate_error_rate: float, seed: int) -> float:
    rng = np.random.default_rng(seed)
    rolled = 0
    looks = [SHADOW_GUARDRAILS.min_samples, *range(LOOK_EVERY, N_MAX + 1, LOOK_EVERY)]
    for _ in range(RUNS):
        fields: dict[str, float] = {}
        done = 0
        for look in looks:
            size = look - done
            done = look
            ctrl_err = rng.random(size) < BASE_ERROR_RATE
            cand_err = rng.random(size) < candidate_error_rate
            both = ~ctrl_err & ~cand_err
            sim = np.clip(rng.normal(SIMILARITY_MEAN, SIMILARITY_SD, size), 0.0, 1.0)[both]
            ctrl_ms = rng.normal(LOG_MS_MEAN, LOG_MS_SD, size)
            cand_ms = rng.normal(LOG_MS_MEAN, LOG_MS_SD, size)
            d = (cand_ms - ctrl_ms)[~cand_err]
            add = {
                "n": size,
                "ctrl_err": ctrl_err.sum(),
                "cand_err": cand_err.sum(),
                "cand_fmt_fail": (rng.random(size) < FORMAT_FAILURE_RATE).sum(),
                "sim_n": len(sim),
                "sim_sum": sim.sum(),
                "sim_sq": (sim * sim).sum(),
                "d_n": len(d),
                "d_sum": d.sum(),
                "d_sq": (d * d).sum(),
            }
            add |= {f"hc:{b}": c for b, c in _bins(ctrl_ms[~cand_err]).items()}
            add |= {f"hk:{b}": c for b, c in _bins(cand_ms[~cand_err]).items()}
            for k, v in add.items():
                fields[k] = fields.get(k, 0.0) + float(v)
            verdict = decide(SHADOW, StepEvidence(pairs=PairStats.from_fields(fields)), SHADOW.step_started_at_ms)
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
