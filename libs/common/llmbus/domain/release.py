"""Releases of a model version (pure): the experiment lifecycle between two versions of one model.

`llmbus models release NAME@VERSION` gives the release an upgrade id (also its experiment id)
and starts the lifecycle of llmbus.domain.lifecycle between the version that serves (control)
and the new one (candidate): shadow (compared, never shown), A/B by user hash, the ramp. The
registry follows each step (`follow`): the candidate goes shadow → canary → serving, and on
promotion the model's serving record becomes the candidate's and the previous version is
retired; a rollback (or an operator's stop) sends the candidate back to registered. A model's
first version has nothing to compare against: its release serves it at once.

A promoted release keeps routing everyone to its version (the serving record says the same): the
router reads llm.experiments in order (one partition) but not in step with llm.models, so
switching the users from the experiment to the serving record at promotion could send some back
to the old version for a moment. The next release of the model closes it (disabled) just before
its own experiment, on the same topic.

Every data point of the rollout carries `context_for(experiment, variant)`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from llmbus.contract.messages import (
    Experiment,
    ExperimentState,
    ModelSpec,
    ModelState,
    ReleaseContext,
    ReleasePlan,
    ReleaseStage,
    StateTransition,
    now_ms,
)
from llmbus.domain.lifecycle import CANDIDATE, create, share_pct
from llmbus.domain.registry import ModelVersions, RegistryError, serving_record, transition

STATE_OF_STAGE = {
    ReleaseStage.SHADOW: ModelState.SHADOW,
    ReleaseStage.AB: ModelState.CANARY,
    ReleaseStage.SERVING: ModelState.SERVING,
    ReleaseStage.ROLLED_BACK: ModelState.REGISTERED,
}


def new_upgrade_id() -> str:
    return f"upg-{uuid.uuid4().hex[:12]}"


def stage_of(experiment: Experiment) -> ReleaseStage:
    if experiment.state in (ExperimentState.STOPPED, ExperimentState.ROLLED_BACK):
        return ReleaseStage.ROLLED_BACK
    if experiment.state == ExperimentState.PROMOTED:
        return ReleaseStage.SERVING
    return ReleaseStage.AB if share_pct(experiment) > 0 else ReleaseStage.SHADOW


def context_for(experiment: Experiment, variant: str) -> ReleaseContext | None:
    """The release context of a data point of `variant` (control or candidate); None: not a release."""
    if not experiment.is_release or experiment.upgrade_id is None or experiment.candidate_version is None:
        return None
    version = experiment.candidate_version if variant == CANDIDATE else experiment.control_version
    return ReleaseContext(
        upgrade_id=experiment.upgrade_id,
        model_version=version or experiment.candidate_version,
        previous_version=experiment.control_version,
        stage=stage_of(experiment),
        share_pct=share_pct(experiment),
    )


@dataclass
class ReleaseStart:
    """What starting a release writes, in order: the version records (llm.models), the model's previous
    release closed, then the new experiment (None: a first version, served at once)."""

    upgrade_id: str
    records: list[ModelSpec]
    experiment: Experiment | None = None
    closes: Experiment | None = None


def start(
    model: ModelVersions,
    version: str,
    *,
    by: str,
    upgrade_id: str | None = None,
    plan: ReleasePlan | None = None,
    salt: str = "",
    previous_release: Experiment | None = None,
) -> ReleaseStart:
    """Start releasing `version` of `model`; `plan` overrides the one its manifest registered.

    `previous_release`: the experiment of the release the serving version came with, if it is still
    on llm.experiments (it routes the users to that version until this one closes it)."""
    candidate = model.versions.get(version)
    if candidate is None:
        raise RegistryError(f"{model.name}@{version} is not registered")
    if running := model.in_release():
        raise RegistryError(f"{model.name}@{running[0].version} is being released ({running[0].state}): end it first")
    if candidate.state != ModelState.REGISTERED:
        state = candidate.state.value if candidate.state else "unmanaged"
        raise RegistryError(f"{model.name}@{version} is {state}: only a registered version can be released")
    upgrade_id = upgrade_id or new_upgrade_id()
    previous = model.serving
    if previous is None:
        first = ReleaseContext(upgrade_id=upgrade_id, model_version=version, stage=ReleaseStage.SERVING)
        served = transition(candidate, ModelState.SERVING, by=by, reason="the model's first version", release=first)
        return ReleaseStart(upgrade_id, [served, serving_record(served)])
    if previous.version == version:
        raise RegistryError(f"{model.name}@{version} serves already")
    plan = plan or candidate.release_plan or ReleasePlan()
    experiment = create(
        upgrade_id,
        model.name,
        model.name,
        shadow_share=plan.shadow_share,
        salt=salt,
        ramp=plan.ramp,
        guardrails=plan.guardrails,
        control_version=previous.version,
        candidate_version=version,
        upgrade_id=upgrade_id,
    )
    records = follow(experiment, model, by=by, reason=f"release {upgrade_id} from {previous.version}")
    closes = None
    if previous_release is not None and previous_release.enabled:
        note = f"closed: release {upgrade_id} follows"
        closes = previous_release.model_copy(update={"enabled": False, "note": note, "updated_at_ms": now_ms()})
    return ReleaseStart(upgrade_id, records, experiment, closes)


def _done(record: ModelSpec, target: ModelState, context: ReleaseContext) -> bool:
    """The record shows this step already (a step written again after a crash adds nothing)."""
    last = record.transitions[-1] if record.transitions else None
    return (
        last is not None
        and last.to_state == target
        and last.release is not None
        and (last.release.upgrade_id, last.release.stage, last.release.share_pct)
        == (context.upgrade_id, context.stage, context.share_pct)
    )


def follow(
    experiment: Experiment, model: ModelVersions, *, by: str, reason: str = "", at_ms: int | None = None
) -> list[ModelSpec]:
    """The llm.models records that make the registry show `experiment`'s step (publish them in order)."""
    context = context_for(experiment, CANDIDATE)
    if context is None or experiment.state == ExperimentState.PAUSED:
        return []
    candidate = model.versions.get(context.model_version)
    if candidate is None:
        raise RegistryError(f"{model.name}@{context.model_version}: no registry record to follow the release")
    target = STATE_OF_STAGE[context.stage]
    if _done(candidate, target, context):
        return []
    moved = transition(candidate, target, by=by, reason=reason, release=context, at_ms=at_ms)
    records = [moved]
    if target == ModelState.SERVING:
        records.append(serving_record(moved))
        previous = model.versions.get(context.previous_version or "")
        if previous is not None and previous.state == ModelState.SERVING:
            why = f"replaced by {context.model_version} ({context.upgrade_id})"
            records.append(transition(previous, ModelState.RETIRED, by=by, reason=why, release=context, at_ms=at_ms))
    return records


@dataclass
class ReleaseSummary:
    """One release of a model as its version records tell it (`llmbus models history`)."""

    upgrade_id: str
    version: str
    previous_version: str | None
    steps: list[StateTransition] = field(default_factory=list)

    @property
    def started_at_ms(self) -> int:
        return self.steps[0].at_ms

    @property
    def ended_at_ms(self) -> int | None:
        return self.steps[-1].at_ms if self.outcome != "in progress" else None

    @property
    def outcome(self) -> str:
        last = self.steps[-1]
        if last.to_state == ModelState.SERVING:
            return "promoted" if self.previous_version else "served (first version)"
        if last.to_state == ModelState.REGISTERED:
            return "rolled back"
        return "in progress"

    @property
    def reason(self) -> str:
        return self.steps[-1].reason


def history(model: ModelVersions) -> list[ReleaseSummary]:
    """Every release of the model, oldest first: the steps its candidate walked and how it ended."""
    releases: dict[str, ReleaseSummary] = {}
    for record in model.versions.values():
        for change in record.transitions:
            context = change.release
            if context is None or context.model_version != record.version:
                continue  # the previous version's retirement belongs to the release, not to its steps
            summary = releases.setdefault(
                context.upgrade_id, ReleaseSummary(context.upgrade_id, record.version, context.previous_version)
            )
            summary.steps.append(change)
    return sorted(releases.values(), key=lambda r: r.started_at_ms)
