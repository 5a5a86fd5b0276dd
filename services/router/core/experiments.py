"""A/B variants and shadow mirroring (pure): sticky, salted-hash decisions.

Bucketing: blake2b("<salt>:<unit>") → an integer in [0, 10,000). The unit is the user id,
else the session id, else the request id (then the assignment is per request, not sticky).
Variants own contiguous bucket ranges in proportion to their normalised weights, so the
same user always lands in the same variant while the experiment's salt and weights stay
the same; a new salt reshuffles everyone.

Shadow selection uses the same hash with a different salt suffix, so whether a user is
mirrored is independent of which A/B variant they are in.

Cost of a shadow copy: the copy keeps the client's tenant (the scheduler and workers need
it for placement and limits) but carries `shadow=True` and `experiment_id`; the worker's
InferenceResult repeats both, and cost-accounting books a result with `shadow=True` to
the experiment (CostRecord.experiment_id), never to the tenant's budget.
"""

from __future__ import annotations

import hashlib

from llmbus.contract.messages import Experiment, InferenceRequest, RoutedRequest, Variant, now_ms
from llmbus.domain.lifecycle import CANDIDATE, supersedes
from llmbus.domain.release import context_for

BUCKETS = 10_000
SHADOW_SUFFIX = ":shadow"
_MAX_REQUEST_ID_CHARS = 128


def bucket_of(unit: str, salt: str) -> int:
    digest = hashlib.blake2b(f"{salt}:{unit}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def unit_of(request: InferenceRequest) -> str:
    return request.user_id or request.session_id or request.request_id


def applies_to(experiment: Experiment, model: str) -> bool:
    return experiment.enabled and (not experiment.match_models or model in experiment.match_models)


def pick(experiment: Experiment, unit: str) -> Variant | None:
    """The variant (name, model, version) of this unit, or None when the experiment has no weighted variant."""
    total = sum(v.weight for v in experiment.variants)
    if total <= 0:
        return None
    bucket = bucket_of(unit, experiment.salt or experiment.experiment_id)
    upper = 0.0
    for variant in experiment.variants:
        upper += variant.weight / total * BUCKETS
        if bucket < upper:
            return variant
    return experiment.variants[-1]  # float rounding at the top edge


def pick_variant(experiment: Experiment, unit: str) -> tuple[str, str] | None:
    """(variant name, model) for this unit, or None when the experiment has no weighted variant."""
    variant = pick(experiment, unit)
    return None if variant is None else (variant.name, variant.model)


def in_shadow(experiment: Experiment, unit: str) -> bool:
    if experiment.shadow_share <= 0 or not experiment.shadow_model:
        return False
    return (
        bucket_of(unit, (experiment.salt or experiment.experiment_id) + SHADOW_SUFFIX)
        < experiment.shadow_share * BUCKETS
    )


def shadow_request_id(request_id: str, experiment_id: str) -> str:
    rid = f"{request_id}.shadow.{experiment_id}"
    if len(rid) <= _MAX_REQUEST_ID_CHARS:
        return rid
    # Still derived (deterministic) so a redelivered request produces the same shadow id.
    return f"{hashlib.blake2b(rid.encode(), digest_size=16).hexdigest()}.shadow"


def shadow_copy(routed: RoutedRequest, experiment: Experiment, tier: str | None = None) -> RoutedRequest:
    """The mirrored request: new derived id, the experiment's reply topic, flagged shadow."""
    original = routed.request
    assert experiment.shadow_model is not None
    request = original.model_copy(
        update={
            "request_id": shadow_request_id(original.request_id, experiment.experiment_id),
            "reply_topic": experiment.shadow_reply_topic,
            "metadata": original.metadata
            | {"llmbus.shadow_of": original.request_id, "llmbus.experiment_id": experiment.experiment_id},
        }
    )
    return RoutedRequest(
        request=request,
        model=experiment.shadow_model,
        route_reason=f"shadow:{experiment.experiment_id}",
        fallback_chain=[],  # a shadow that cannot run is dropped, never moved onto another model
        experiment_id=experiment.experiment_id,
        shadow=True,
        prompt_tokens_est=routed.prompt_tokens_est,
        prompt_tokenizer=routed.prompt_tokenizer,
        trimmed_tokens=routed.trimmed_tokens,
        max_tokens_requested=routed.max_tokens_requested,
        received_at_ms=routed.received_at_ms,
        routed_at_ms=now_ms(),
        tier=tier,  # the shadow model's
        user_ref=routed.user_ref,
        cache_group=routed.cache_group,  # the same tenant: its prefix caches are the primary's
        release=context_for(experiment, CANDIDATE),
    )


class ExperimentBook:
    """The experiments the router knows, fed from the compacted llm.experiments topic."""

    def __init__(self) -> None:
        self._by_id: dict[str, Experiment] = {}

    def apply(self, experiment: Experiment | None, experiment_id: str | None = None) -> None:
        """Upsert the highest version (an older change read later never wins); a tombstone (None value)
        for `experiment_id` removes it."""
        if experiment is None:
            if experiment_id:
                self._by_id.pop(experiment_id, None)
            return
        if supersedes(experiment, self._by_id.get(experiment.experiment_id)):
            self._by_id[experiment.experiment_id] = experiment

    def release_for(self, model: str) -> Experiment | None:
        """The release of `model` in its shadow or A/B steps (its primaries carry its context), if one is on."""
        return next((e for e in self._sorted() if e.is_release and applies_to(e, model)), None)

    def ab_for(self, model: str) -> list[Experiment]:
        return [e for e in self._sorted() if e.kind == "ab" and applies_to(e, model)]

    def shadows_for(self, model: str) -> list[Experiment]:
        return [e for e in self._sorted() if e.kind == "shadow" and applies_to(e, model)]

    def _sorted(self) -> list[Experiment]:
        return [self._by_id[k] for k in sorted(self._by_id)]

    def __len__(self) -> int:
        return len(self._by_id)
