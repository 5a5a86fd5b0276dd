"""Tests that survive peeking: mSPRT with a normal mixture (always-valid p-values).

The experiment is looked at on every tick of the decision loop. A fixed-horizon test
checked that often rejects a true null far more than alpha of the time; the mixture
sequential probability ratio test (Robbins 1970; Johari, Pekelis, Walsh, "Always valid
inference", 2017) does not: under H0 its likelihood ratio Λ_n is a nonnegative
martingale with mean 1, so by Ville's inequality P(sup_n Λ_n ≥ 1/alpha) ≤ alpha. The p-value
p_n = min(1, 1/Λ_n) and the confidence sequence below are
valid at every n at once.

For a difference θ of two means, with the estimate θ̂ and its variance V = σ²_A/n_A +
σ²_B/n_B (plugged in from the data: the asymptotic version, valid for the sample sizes
the guardrails require), and a N(0, τ²) mixture over θ:

    Λ = sqrt(V / (V + τ²)) · exp(θ̂² τ² / (2 V (V + τ²)))

τ is the scale of effects we care about (a few percentage points of error rate, a tenth
in log latency); it tunes power, never validity. Proportions are means of 0/1 outcomes,
latency is compared as the mean of log milliseconds (a ratio of geometric means; robust
to the long tail). Fixed-horizon counterparts, for cross-checking against scipy, sit at
the bottom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Moments:
    """Sufficient statistics of one arm: count, sum and sum of squares (mergeable by adding)."""

    n: int
    total: float
    total_sq: float

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0

    @property
    def var(self) -> float:
        if self.n < 2:
            return 0.0
        return max(0.0, (self.total_sq - self.total * self.total / self.n) / (self.n - 1))

    @classmethod
    def of_proportion(cls, successes: int, n: int) -> Moments:
        return cls(n, float(successes), float(successes))


@dataclass(frozen=True)
class SequentialResult:
    estimate: float  # B minus A
    p_value: float  # always valid: the test rejects at the first look where it is <= alpha
    ci_low: float
    ci_high: float
    log_lr: float

    def rejects(self, alpha: float) -> bool:
        return self.p_value <= alpha


def msprt(estimate: float, variance: float, tau: float, alpha: float) -> SequentialResult:
    if variance <= 0:
        return SequentialResult(estimate, 1.0, -math.inf, math.inf, 0.0)
    tau2 = tau * tau
    log_lr = 0.5 * math.log(variance / (variance + tau2)) + estimate * estimate * tau2 / (
        2 * variance * (variance + tau2)
    )
    p_value = min(1.0, math.exp(-log_lr)) if log_lr > 0 else 1.0
    radius = 2 * math.log(1 / alpha) + math.log((variance + tau2) / variance)
    half_width = math.sqrt(variance * (variance + tau2) / tau2 * radius)
    return SequentialResult(estimate, p_value, estimate - half_width, estimate + half_width, log_lr)


def msprt_means(a: Moments, b: Moments, tau: float, alpha: float) -> SequentialResult:
    if a.n < 2 or b.n < 2:
        return SequentialResult(b.mean - a.mean, 1.0, -math.inf, math.inf, 0.0)
    return msprt(b.mean - a.mean, a.var / a.n + b.var / b.n, tau, alpha)


def _smoothed(successes: int, n: int) -> float:
    # Half a success and half a failure keep the variance off zero while no event was seen yet.
    return (successes + 0.5) / (n + 1)


def msprt_proportions(x_a: int, n_a: int, x_b: int, n_b: int, tau: float, alpha: float) -> SequentialResult:
    if n_a == 0 or n_b == 0:
        return SequentialResult(0.0, 1.0, -math.inf, math.inf, 0.0)
    pa, pb = _smoothed(x_a, n_a), _smoothed(x_b, n_b)
    variance = pa * (1 - pa) / n_a + pb * (1 - pb) / n_b
    return msprt(x_b / n_b - x_a / n_a, variance, tau, alpha)


# Fixed-horizon tests: valid only when looked at once, at a sample size fixed in advance.


def normal_two_sided_p(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2))


def z_test_proportions(x_a: int, n_a: int, x_b: int, n_b: int) -> float:
    """Pooled two-proportion z-test p-value (equals the uncorrected chi-square test on the 2x2 table)."""
    pooled = (x_a + x_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0:
        return 1.0
    return normal_two_sided_p((x_b / n_b - x_a / n_a) / se)


def welch_z_p(a: Moments, b: Moments) -> float:
    """Welch's statistic with a normal reference (large-sample; scipy's Welch t agrees as n grows)."""
    se = math.sqrt(a.var / a.n + b.var / b.n)
    return 1.0 if se == 0 else normal_two_sided_p((b.mean - a.mean) / se)
