"""Sequential tests: valid under continuous monitoring (seeded A/A), powerful, and equal to scipy at a fixed horizon."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from llmbus_services.shadow_comparator.core.sequential import (
    Moments,
    msprt_means,
    msprt_proportions,
    welch_z_p,
    z_test_proportions,
)
from llmbus_services.shadow_comparator.core.simulate import (
    _proportion_stats,
    msprt_log_lr,
    simulate_log_latency,
    simulate_proportions,
)


@pytest.mark.parametrize("p", [0.02, 0.05, 0.3])
def test_aa_proportions_false_positive_rate_at_most_alpha_when_looked_at_every_10_requests(p: float) -> None:
    result = simulate_proportions(p, p, runs=600, n_max=2000, alpha=0.05, seed=11)
    assert result.rate <= 0.05, result.rate


def test_aa_latency_false_positive_rate_at_most_alpha_under_continuous_monitoring() -> None:
    result = simulate_log_latency(6.0, 6.0, 0.6, runs=400, n_max=1500, alpha=0.05, seed=12)
    assert result.rate <= 0.05, result.rate


def test_fixed_horizon_test_peeked_at_the_same_looks_is_not_valid() -> None:
    # The reason for the sequential test: the same looks with a z-test reject a true null far too often.
    result = simulate_proportions(0.05, 0.05, runs=600, n_max=2000, seed=11, fixed_horizon=True)
    assert result.rate > 0.15, result.rate


def test_power_error_rate_5_to_10_percent_detected_within_1500_requests_per_arm() -> None:
    result = simulate_proportions(0.05, 0.10, runs=400, n_max=1500, seed=13)
    assert result.detected_within(1500) >= 0.9, result.detected_within(1500)


def test_power_latency_plus_10_percent_geometric_mean_detected_within_1500_requests_per_arm() -> None:
    result = simulate_log_latency(6.0, 6.0 + math.log(1.1), 0.5, runs=300, n_max=1500, seed=14)
    assert result.detected_within(1500) >= 0.9, result.detected_within(1500)


def test_vectorised_statistic_is_the_scalar_one() -> None:
    xa, xb, n = 12, 30, 400
    scalar = msprt_proportions(xa, n, xb, n, tau=0.05, alpha=0.05)
    est, var = _proportion_stats(np.array([float(xa)]), np.array([float(xb)]), np.array([float(n)]))
    assert math.isclose(float(msprt_log_lr(est, var, 0.05)[0]), scalar.log_lr, rel_tol=1e-12)
    assert math.isclose(scalar.p_value, math.exp(-scalar.log_lr))


def test_confidence_sequence_is_wider_than_the_fixed_horizon_interval_and_contains_the_estimate() -> None:
    result = msprt_proportions(40, 1000, 60, 1000, tau=0.05, alpha=0.05)
    pa, pb = 0.04, 0.06
    fixed_half = 1.96 * math.sqrt(pa * (1 - pa) / 1000 + pb * (1 - pb) / 1000)
    assert result.ci_low < 0.02 < result.ci_high
    assert (result.ci_high - result.ci_low) / 2 > fixed_half


@pytest.mark.parametrize(("xa", "na", "xb", "nb"), [(40, 1000, 60, 1000), (5, 200, 17, 250), (300, 900, 280, 950)])
def test_fixed_horizon_two_proportion_test_matches_scipy_chi_square(xa: int, na: int, xb: int, nb: int) -> None:
    table = [[xa, na - xa], [xb, nb - xb]]
    _, p_scipy, _, _ = stats.chi2_contingency(table, correction=False)
    assert math.isclose(z_test_proportions(xa, na, xb, nb), p_scipy, rel_tol=1e-9)


def test_fixed_horizon_latency_test_matches_scipy_welch_t_at_large_n() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(6.0, 0.5, 4000), rng.normal(6.03, 0.55, 3500)
    ma = Moments(len(a), float(a.sum()), float((a * a).sum()))
    mb = Moments(len(b), float(b.sum()), float((b * b).sum()))
    p_scipy = stats.ttest_ind(b, a, equal_var=False).pvalue
    assert math.isclose(welch_z_p(ma, mb), p_scipy, rel_tol=0.02)
    assert math.isclose(ma.var, float(np.var(a, ddof=1)), rel_tol=1e-9)
    # The always-valid p-value is never below the fixed-horizon one: it pays for the freedom to peek.
    assert msprt_means(ma, mb, tau=0.1, alpha=0.05).p_value >= welch_z_p(ma, mb)


def test_no_evidence_without_data() -> None:
    assert msprt_proportions(0, 0, 0, 0, 0.05, 0.05).p_value == 1.0
    assert msprt_means(Moments(1, 1.0, 1.0), Moments(0, 0.0, 0.0), 0.1, 0.05).p_value == 1.0
