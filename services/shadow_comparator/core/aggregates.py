"""Per experiment, step and variant aggregates in mergeable form: flat counters that add.

Each record contributes a dict of increments (`variant_increments`, `pair_increments`,
`cost_increments`, `feedback_increments`); the store applies them with HINCRBYFLOAT on one
Redis hash per (experiment, step, variant), once per record id. Since every field is a
sum (counts, sums, sums of squares, histogram bins `h:<bin>`), any number of comparator
instances can write the same hash, and steps or windows merge by adding hashes.
`VariantStats` / `PairStats` read a hash back into what guardrails and tests need.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from llmbus.contract.messages import Comparison, FinishReason, InferenceResult, ResultStatus
from llmbus_services.shadow_comparator.core.sequential import Moments
from llmbus_services.shadow_comparator.core.sketch import LatencyHistogram, bin_of

Increments = dict[str, float]

PAIRS = "pairs"  # the pseudo-variant holding shadow pairs


def _log_ms(value_ms: float) -> float:
    return math.log(max(value_ms, 0.1))


def variant_increments(result: InferenceResult) -> Increments:
    inc: Increments = {"n": 1}
    if result.status == ResultStatus.OK:
        inc["ok"] = 1
        inc[f"fin:{(result.finish_reason or FinishReason.STOP).value}"] = 1
    else:
        inc["err"] = 1
    total_ms = result.timings.total_ms
    if result.status == ResultStatus.OK and total_ms is not None:
        log_ms = _log_ms(total_ms)
        inc |= {"lat_n": 1, "lat_log_sum": log_ms, "lat_log_sq": log_ms * log_ms, f"h:{bin_of(total_ms)}": 1}
    if result.status == ResultStatus.OK and result.timings.ttft_ms is not None:
        inc[f"t:{bin_of(result.timings.ttft_ms)}"] = 1
    return inc


def pair_increments(comparison: Comparison) -> Increments:
    control, candidate = comparison.control, comparison.candidate
    inc: Increments = {
        "n": 1,
        "ctrl_err": float(control.error_class != "ok"),
        "cand_err": float(candidate.error_class != "ok"),
        "ctrl_fmt_fail": float(control.format.failed),
        "cand_fmt_fail": float(candidate.format.failed),
        "len_delta_sum": comparison.length_delta_tokens,
    }
    if comparison.similarity is not None:
        s = comparison.similarity
        inc |= {"sim_n": 1, "sim_sum": s, "sim_sq": s * s}
    if control.total_ms is not None and candidate.total_ms is not None and candidate.error_class == "ok":
        d = _log_ms(candidate.total_ms) - _log_ms(control.total_ms)
        inc |= {
            "d_n": 1,
            "d_sum": d,
            "d_sq": d * d,
            f"hc:{bin_of(control.total_ms)}": 1,
            f"hk:{bin_of(candidate.total_ms)}": 1,
        }
    if comparison.ttft_delta_ms is not None:
        inc |= {"ttft_d_n": 1, "ttft_d_sum": comparison.ttft_delta_ms}
    return {k: v for k, v in inc.items() if v}


def cost_increments(cost_usd: float, counts_request: bool = True) -> Increments:
    """A cost record's; `counts_request` False: an earlier leg of a continued answer (its cost, not a request)."""
    return {"cost_n": int(counts_request), "cost_usd": cost_usd}


NEGATIVE_SCORE = 0.5  # a score below this (thumbs down, 1-2 of 5 stars) is negative feedback


def feedback_increments(score: float) -> Increments:
    return {"fb_n": 1, "fb_sum": score, "fb_neg": float(score < NEGATIVE_SCORE)}


def _hist(fields: Mapping[str, float], prefix: str) -> LatencyHistogram:
    return LatencyHistogram({int(k[len(prefix) :]): int(v) for k, v in fields.items() if k.startswith(prefix)})


def _rate(num: float, den: float) -> float | None:
    return num / den if den else None


@dataclass(frozen=True)
class VariantStats:
    n: int
    ok: int
    errors: int
    stopped: int
    latency: LatencyHistogram
    ttft: LatencyHistogram
    log_latency: Moments
    cost_n: int
    cost_usd: float
    feedback_n: int
    feedback_negative: int

    @classmethod
    def from_fields(cls, f: Mapping[str, float]) -> VariantStats:
        g = f.get
        return cls(
            n=int(g("n", 0)),
            ok=int(g("ok", 0)),
            errors=int(g("err", 0)),
            stopped=int(g("fin:stop", 0)),
            latency=_hist(f, "h:"),
            ttft=_hist(f, "t:"),
            log_latency=Moments(int(g("lat_n", 0)), g("lat_log_sum", 0.0), g("lat_log_sq", 0.0)),
            cost_n=int(g("cost_n", 0)),
            cost_usd=g("cost_usd", 0.0),
            feedback_n=int(g("fb_n", 0)),
            feedback_negative=int(g("fb_neg", 0)),
        )

    @property
    def error_rate(self) -> float | None:
        return _rate(self.errors, self.n)

    @property
    def completion_rate(self) -> float | None:
        """Finished with `stop` (not error, length or abort) over all requests."""
        return _rate(self.stopped, self.n)

    @property
    def negative_feedback_rate(self) -> float | None:
        return _rate(self.feedback_negative, self.feedback_n)

    @property
    def cost_per_request_usd(self) -> float | None:
        return _rate(self.cost_usd, self.cost_n)


@dataclass(frozen=True)
class PairStats:
    n: int
    control_errors: int
    candidate_errors: int
    candidate_format_failures: int
    similarity: Moments
    log_latency_delta: Moments  # candidate minus control, per pair
    control_latency: LatencyHistogram
    candidate_latency: LatencyHistogram
    ttft_delta_mean_ms: float | None

    @classmethod
    def from_fields(cls, f: Mapping[str, float]) -> PairStats:
        g = f.get
        return cls(
            n=int(g("n", 0)),
            control_errors=int(g("ctrl_err", 0)),
            candidate_errors=int(g("cand_err", 0)),
            candidate_format_failures=int(g("cand_fmt_fail", 0)),
            similarity=Moments(int(g("sim_n", 0)), g("sim_sum", 0.0), g("sim_sq", 0.0)),
            log_latency_delta=Moments(int(g("d_n", 0)), g("d_sum", 0.0), g("d_sq", 0.0)),
            control_latency=_hist(f, "hc:"),
            candidate_latency=_hist(f, "hk:"),
            ttft_delta_mean_ms=_rate(g("ttft_d_sum", 0.0), g("ttft_d_n", 0)),
        )

    @property
    def similarity_mean(self) -> float | None:
        return self.similarity.mean if self.similarity.n else None

    @property
    def candidate_error_rate(self) -> float | None:
        return _rate(self.candidate_errors, self.n)

    @property
    def control_error_rate(self) -> float | None:
        return _rate(self.control_errors, self.n)

    @property
    def format_failure_rate(self) -> float | None:
        return _rate(self.candidate_format_failures, self.n)
