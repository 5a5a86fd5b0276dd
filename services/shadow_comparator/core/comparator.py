"""The comparator's work per record, over its store (core/ports.py); publishing is the caller's (no broker here).

- results: a shadow result or a primary the router mirrored (its `shadowed_by`; a result that does not
  say: one the shadow experiments may have mirrored) is offered to the join; each completed pair becomes a
  Comparison and counts once in its experiment's pair aggregates. An A/B result counts once in its
  variant's aggregates and is linked to its (experiment, step, variant) and its tenant, so costs and
  feedback arriving later join it by request key (tenant and request id, llmbus.contract.request_key:
  two tenants' requests with the same id are two requests, two pairs); feedback counts only when it
  comes from that tenant (a tenant that learns another's request id cannot pre-empt its feedback: the
  foreign one takes no once-only mark).
- sweep: pairs past their TTL are removed and counted (missing primary, unshadowed primary).
- decide: one verdict per lifecycle experiment from its current step's aggregates.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from llmbus.contract.messages import (
    Comparison,
    CostRecord,
    Experiment,
    ExperimentState,
    Feedback,
    InferenceResult,
    ModelSpec,
    now_ms,
)
from llmbus.contract.request_key import request_key
from llmbus.domain.lifecycle import CANDIDATE, CONTROL, supersedes
from llmbus.domain.registry import RegistryError, by_model
from llmbus.domain.release import follow
from llmbus_services.shadow_comparator.core.aggregates import (
    PAIRS,
    PairStats,
    VariantStats,
    cost_increments,
    feedback_increments,
    pair_increments,
    variant_increments,
)
from llmbus_services.shadow_comparator.core.compare import compare
from llmbus_services.shadow_comparator.core.decide import StepEvidence, Verdict, decide
from llmbus_services.shadow_comparator.core.join import feedback_belongs, pair_ref
from llmbus_services.shadow_comparator.core.ports import PairStore
from llmbus_services.shadow_comparator.core.samples import not_a_sample, variant_model, variant_version

log = logging.getLogger(__name__)

PublishComparison = Callable[[Comparison], Awaitable[None]]


class ExperimentView:
    """The experiments as llm.experiments last described them.

    A shadow experiment that stops mirroring (its ramp promoted past 0 %: it becomes an A/B one; stopped;
    deleted) still has pairs in flight: shadows sent before the change whose primaries come after it. Its
    models stay `recently_shadowed` for `linger_ms` (the pairs' TTL), so those primaries still complete them
    (a primary whose result names the experiments that mirrored it, `shadowed_by`, is held whatever this says).
    """

    def __init__(self, linger_ms: int = 600_000) -> None:
        self.by_id: dict[str, Experiment] = {}
        self.linger_ms = linger_ms
        self.unshadowed_until: dict[str | None, int] = {}  # model (None: every model) → until when
        self.mirrored_at_step: dict[str, int] = {}  # an experiment that stopped mirroring → its last shadow step

    def apply(self, experiment: Experiment | None, experiment_id: str | None = None) -> None:
        if experiment is None:
            if experiment_id and (gone := self.by_id.pop(experiment_id, None)) is not None:
                self._stopped_mirroring(gone)
            return
        before = self.by_id.get(experiment.experiment_id)
        if supersedes(experiment, before):  # the highest version
            self.by_id[experiment.experiment_id] = experiment
            if before is not None and _mirrors(before) and not _mirrors(experiment):
                self._stopped_mirroring(before)

    def _stopped_mirroring(self, experiment: Experiment) -> None:
        if not _mirrors(experiment):
            return
        until = now_ms() + self.linger_ms
        self.mirrored_at_step[experiment.experiment_id] = experiment.step
        models: list[str | None] = list(experiment.match_models) or [None]
        for model in models:
            self.unshadowed_until[model] = max(until, self.unshadowed_until.get(model, 0))

    def recently_shadowed(self, model: str | None, at_ms: int) -> bool:
        """A shadow experiment covered the model less than `linger_ms` ago: a primary may complete a pair."""
        for key in [k for k, until in self.unshadowed_until.items() if until <= at_ms]:
            del self.unshadowed_until[key]
        return model in self.unshadowed_until or None in self.unshadowed_until

    def step_of(self, experiment_id: str) -> int:
        experiment = self.by_id.get(experiment_id)
        return experiment.step if experiment is not None else 0

    def pair_step(self, experiment_id: str) -> int:
        """The step a pair's aggregates belong to: the experiment's own, or, once it stopped mirroring, the last
        step it mirrored at (a pair completed after a promote was mirrored then)."""
        experiment = self.by_id.get(experiment_id)
        if experiment is not None and _mirrors(experiment):
            return experiment.step
        return self.mirrored_at_step.get(experiment_id, self.step_of(experiment_id))

    def may_be_shadowed(self, model: str | None) -> bool:
        """A primary is worth holding when an enabled shadow experiment covers its model."""
        return any(_mirrors(e) and (not e.match_models or model in e.match_models) for e in self.by_id.values())

    def lifecycle(self) -> list[Experiment]:
        return [e for e in self.by_id.values() if e.ramp is not None and e.candidate_model and e.control_model]


def _mirrors(experiment: Experiment) -> bool:
    return bool(experiment.enabled and experiment.kind == "shadow" and experiment.shadow_model)


@dataclass
class Comparator:
    store: PairStore
    experiments: ExperimentView
    publish_comparison: PublishComparison
    max_text_chars: int = 16_000
    models: dict[str, ModelSpec] = field(default_factory=dict)  # llm.models as read: key → latest record

    def registry_steps(self, experiment: Experiment, reason: str) -> list[ModelSpec]:
        """The registry records that follow a release's new step (none for other experiments);
        RegistryError when the registry lacks the release's version record."""
        if not experiment.is_release or experiment.candidate_model is None:
            return []
        model = by_model(self.models).get(experiment.candidate_model)
        if model is None:
            raise RegistryError(f"model {experiment.candidate_model!r} is not in the registry")
        return follow(experiment, model, by="shadow-comparator", reason=reason)

    async def on_result(self, result: InferenceResult) -> None:
        if result.experiment_id and result.variant and not result.shadow:
            await self._count_variant(result)
        ref = pair_ref(result)
        if ref is None:
            await self.store.count(unjoinable=1)
            return
        held = ref.is_shadow or self._held(result)
        if not held and not self._may_complete(result):
            return
        stored = result.model_copy(update={"text": result.text[: self.max_text_chars]})
        done_id = f"{ref.primary_key}:{ref.experiment_id}" if ref.is_shadow else None
        # A primary not held (not mirrored, or shadowed until lately) joins only a shadow already waiting for it.
        status, sides = await self.store.offer(
            ref.primary_key, ref.field, stored.to_bytes(), now_ms(), done_id, only_if_waiting=not held
        )
        if status == "skip":
            return
        if status in ("done", "dup"):
            await self.store.count(duplicate=1)
        if status == "late":
            await self.store.count(**{f"late_{'shadow' if ref.is_shadow else 'primary'}": 1})
            return
        if status == "done" or "p" not in sides:
            return
        primary = InferenceResult.model_validate_json(sides["p"])
        for name, raw in sides.items():
            if name.startswith("s:"):
                await self._pair(name.removeprefix("s:"), primary, InferenceResult.model_validate_json(raw))

    def _held(self, primary: InferenceResult) -> bool:
        """A primary is held until its shadows' results join it: the router said it mirrored it (exact, whenever
        it is read: the experiment may have stopped mirroring since, this comparator may have restarted), or,
        when its result does not say (a router from before `shadowed_by`), an enabled shadow experiment covers
        its model as this comparator reads llm.experiments now."""
        if primary.shadowed_by is not None:
            return bool(primary.shadowed_by)
        return self.experiments.may_be_shadowed(primary.model)

    def _may_complete(self, primary: InferenceResult) -> bool:
        """A primary not held may still complete a shadow already waiting for it: one its model's experiment
        mirrors now, or mirrored until lately."""
        model = primary.model
        return self.experiments.may_be_shadowed(model) or self.experiments.recently_shadowed(model, now_ms())

    async def _pair(self, experiment_id: str, primary: InferenceResult, shadow: InferenceResult) -> None:
        comparison = compare(experiment_id, primary, shadow)
        # Published before it is counted: a crash in between republishes the same comparison_id
        # (readers dedupe on it) and counts it then, once.
        await self.publish_comparison(comparison)
        counted = await self.store.apply_once(
            "pair",
            comparison.comparison_id,
            self.store.agg_key(experiment_id, self.experiments.pair_step(experiment_id), PAIRS),
            pair_increments(comparison),
            settle=(primary.request_key, f"s:{experiment_id}"),
        )
        if counted:
            await self.store.count(pairs=1)

    async def _count_variant(self, result: InferenceResult) -> None:
        assert result.experiment_id and result.variant
        experiment = self.experiments.by_id.get(result.experiment_id)
        model, version = variant_model(experiment, result.variant), variant_version(experiment, result.variant)
        if (why := not_a_sample(result, model, version)) is not None:
            await self.store.count(**{f"not_a_sample_{why}": 1})
            return
        step = self.experiments.step_of(result.experiment_id)
        agg = self.store.agg_key(result.experiment_id, step, result.variant)
        if await self.store.apply_once("result", result.request_key, agg, variant_increments(result)):
            await self.store.remember_request(
                result.request_key, result.experiment_id, step, result.variant, result.tenant
            )

    async def on_cost(self, cost: CostRecord) -> None:
        # Once per record: a continued answer's legs are billed by a record each, and its cost is their sum.
        increments = cost_increments(cost.cost_usd, counts_request=cost.leg is None)
        await self._join_late("cost", cost.request_id, increments, cost.tenant, once=cost.record_id or None)

    async def on_feedback(self, feedback: Feedback) -> None:
        """`feedback.tenant` is the authenticated one (the handler took it from the topic when auth is on)."""
        await self._join_late("feedback", feedback.request_id, feedback_increments(feedback.score), feedback.tenant)

    async def on_feedback_refused(self, reason: str) -> None:
        log.warning("feedback refused: %s", reason)
        await self.store.count(feedback_refused=1)

    async def _join_late(
        self, kind: str, request_id: str, increments: dict[str, float], from_tenant: str, once: str | None = None
    ) -> None:
        """A cost or a feedback joins its request by request key (`from_tenant`'s request of that id), applied
        once per request key, or per `once` (a cost record's id)."""
        key = request_key(from_tenant, request_id)
        link = await self.store.request_variant(key, request_id)
        if link is None:
            await self.store.count(**{f"{kind}_unjoined": 1})  # not an A/B request, or its result is gone
            return
        if not feedback_belongs(link.tenant, from_tenant):
            log.warning(
                "%s on %s from tenant %r: the request is %r's; not counted", kind, request_id, from_tenant, link.tenant
            )
            await self.store.count(**{f"{kind}_foreign": 1})
            return
        agg = self.store.agg_key(link.experiment_id, link.step, link.variant)
        if await self.store.apply_once(kind, once or key, agg, increments):
            await self.store.count(**{f"{kind}_joined": 1})

    async def sweep(self, now: int | None = None) -> dict[str, int]:
        counts: dict[str, int] = {}
        for primary_key in await self.store.due(now if now is not None else now_ms()):
            sides = await self.store.sweep_one(primary_key)
            if sides is None:
                continue
            shadows = [k for k in sides if k.startswith("s:")]
            if shadows:
                counts["missing_primary"] = counts.get("missing_primary", 0) + len(shadows)
            elif "p" in sides and "paired" not in sides:
                counts["unshadowed_primary"] = counts.get("unshadowed_primary", 0) + 1
        if counts:
            await self.store.count(**counts)
        return counts

    async def evidence(self, experiment: Experiment) -> StepEvidence:
        exp_id, step = experiment.experiment_id, experiment.step
        if experiment.kind == "shadow":
            return StepEvidence(pairs=PairStats.from_fields(await self.store.read_agg(exp_id, step, PAIRS)))
        return StepEvidence(
            control=VariantStats.from_fields(await self.store.read_agg(exp_id, step, CONTROL)),
            candidate=VariantStats.from_fields(await self.store.read_agg(exp_id, step, CANDIDATE)),
        )

    async def decide_all(self, now: int | None = None) -> list[Verdict]:
        verdicts = []
        for experiment in self.experiments.lifecycle():
            if experiment.state in (ExperimentState.RUNNING, ExperimentState.PAUSED):
                verdict = decide(experiment, await self.evidence(experiment), now if now is not None else now_ms())
                if verdict is not None:
                    verdicts.append(verdict)
        return verdicts
