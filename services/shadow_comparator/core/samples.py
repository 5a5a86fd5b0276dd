"""Which results are evidence about a variant's model (pure).

A/B aggregates must hold only answers the variant's own model produced. Everything else a
request in the bucket can end as says nothing about that model, and a tenant (who picks its
user ids, hence its buckets, and what it asks) could steer a rollout with it: cache hits and
coalesced answers (another request's answer, served by the router), answers from a fallback
model (the variant's model was unavailable: a candidate with no workers would look healthy on
its fallback's answers), and errors the caller caused (invalid input, limits, budget, refusals)
or that never reached a model (cancelled). Errors of serving the model (no worker, timeouts,
engine failures) stay: they are the variant's errors.
"""

from __future__ import annotations

from llmbus.contract.messages import ErrorCode, Experiment, InferenceResult, ResultStatus

# Errors that are the caller's doing or never involved the model: not evidence about it.
NOT_THE_MODELS_ERRORS = frozenset(
    {
        ErrorCode.INVALID_REQUEST,
        ErrorCode.MALFORMED,
        ErrorCode.REQUEST_TOO_LARGE,
        ErrorCode.PROMPT_TOO_LONG,
        ErrorCode.MAX_TOKENS_TOO_LARGE,
        ErrorCode.RATE_LIMITED,
        ErrorCode.OVER_BUDGET,
        ErrorCode.CANCELLED,
        ErrorCode.FORBIDDEN,
    }
)
_NOT_GENERATED_PREFIXES = ("cache_hit", "coalesced", "semantic")


def variant_version(experiment: Experiment | None, variant: str) -> str | None:
    """The registry version a release's variant runs (None: any version, or not a release)."""
    if experiment is None:
        return None
    return next((v.version for v in experiment.variants if v.name == variant), None)


def variant_model(experiment: Experiment | None, variant: str) -> str | None:
    if experiment is None:
        return None
    for v in experiment.variants:
        if v.name == variant:
            return v.model
    return {"control": experiment.control_model, "candidate": experiment.candidate_model}.get(variant)


def not_a_sample(result: InferenceResult, model: str | None, version: str | None = None) -> str | None:
    """None when `result` is a sample of the variant whose model is `model` (and `version`, in a release); else why."""
    reason = result.route_reason or ""
    if result.cached or reason.startswith(_NOT_GENERATED_PREFIXES):
        return "not_generated"
    if result.status == ResultStatus.ERROR and result.error is not None and result.error.code in NOT_THE_MODELS_ERRORS:
        return "caller_error"
    if reason.startswith("fallback") or (model is not None and result.model is not None and result.model != model):
        return "other_model"
    if version is not None and result.model_version is not None and result.model_version != version:
        return "other_model"
    return None
