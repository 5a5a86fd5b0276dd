"""Seeded simulations of continuously monitored experiments (numpy, vectorised over runs).

Each run draws both arms request by request and looks at the test every `look_every`
requests per arm from `first_look` on, exactly as the decision loop would; a run counts
as a rejection the first time any look rejects. Used by the unit tests (A/A false-positive
rate, power) and bench/comparator_bench.py (the report). The vectorised statistics are the
formulas of core/sequential.py; a test checks they agree with the scalar ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]


@dataclass(frozen=True)
class SimResult:
    runs: int
    rejected: int
    first_rejection_n: Array  # per-arm sample size at the first rejection (nan: never)

    @property
    def rate(self) -> float:
        return self.rejected / self.runs

    def detected_within(self, n: int) -> float:
        return float(np.mean(np.nan_to_num(self.first_rejection_n, nan=np.inf) <= n))


def msprt_log_lr(estimate: Array, variance: Array, tau: float) -> Array:
    tau2 = tau * tau
    v = np.maximum(variance, 1e-300)
    return 0.5 * np.log(v / (v + tau2)) + estimate**2 * tau2 / (2 * v * (v + tau2))


def _proportion_stats(xa: Array, xb: Array, n: Array) -> tuple[Array, Array]:
    pa, pb = (xa + 0.5) / (n + 1), (xb + 0.5) / (n + 1)
    return xb / n - xa / n, pa * (1 - pa) / n + pb * (1 - pb) / n


def _looks(n_max: int, first_look: int, look_every: int) -> NDArray[np.int64]:
    return np.arange(first_look, n_max + 1, look_every)


def _first_rejection(reject: NDArray[np.bool_], looks: NDArray[np.int64]) -> SimResult:
    any_reject = reject.any(axis=1)
    first = np.where(any_reject, looks[np.argmax(reject, axis=1)].astype(float), np.nan)
    return SimResult(runs=reject.shape[0], rejected=int(any_reject.sum()), first_rejection_n=first)


def simulate_proportions(
    p_a: float,
    p_b: float,
    *,
    runs: int,
    n_max: int,
    alpha: float = 0.05,
    tau: float = 0.05,
    first_look: int = 30,
    look_every: int = 10,
    seed: int = 0,
    fixed_horizon: bool = False,
) -> SimResult:
    """Two arms of Bernoulli outcomes; mSPRT (or, to show why not, a fixed-horizon z-test) at every look."""
    rng = np.random.default_rng(seed)
    looks = _looks(n_max, first_look, look_every)
    xa = np.cumsum(rng.random((runs, n_max)) < p_a, axis=1)[:, looks - 1].astype(float)
    xb = np.cumsum(rng.random((runs, n_max)) < p_b, axis=1)[:, looks - 1].astype(float)
    n = looks.astype(float)[None, :]
    if fixed_horizon:
        pooled = (xa + xb) / (2 * n)
        se = np.sqrt(np.maximum(pooled * (1 - pooled) * 2 / n, 1e-300))
        reject = np.abs((xb - xa) / n) / se > 1.959963984540054
        reject &= pooled > 0
    else:
        estimate, variance = _proportion_stats(xa, xb, n)
        reject = msprt_log_lr(estimate, variance, tau) >= np.log(1 / alpha)
    return _first_rejection(reject, looks)


def simulate_log_latency(
    mu_a: float,
    mu_b: float,
    sigma: float,
    *,
    runs: int,
    n_max: int,
    alpha: float = 0.05,
    tau: float = 0.1,
    first_look: int = 30,
    look_every: int = 10,
    seed: int = 0,
) -> SimResult:
    """Log-normal latencies: mSPRT on the difference of mean log latency (plug-in variances)."""
    rng = np.random.default_rng(seed)
    looks = _looks(n_max, first_look, look_every)
    a = rng.normal(mu_a, sigma, (runs, n_max))
    b = rng.normal(mu_b, sigma, (runs, n_max))
    n = looks.astype(float)[None, :]
    stats = []
    for arm in (a, b):
        s1 = np.cumsum(arm, axis=1)[:, looks - 1]
        s2 = np.cumsum(arm * arm, axis=1)[:, looks - 1]
        mean = s1 / n
        var = np.maximum((s2 - s1 * s1 / n) / (n - 1), 0.0)
        stats.append((mean, var))
    (ma, va), (mb, vb) = stats
    reject = msprt_log_lr(mb - ma, va / n + vb / n, tau) >= np.log(1 / alpha)
    return _first_rejection(reject, looks)
