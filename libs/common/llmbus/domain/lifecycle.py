"""The experiment lifecycle as pure transitions on the Experiment record.

A lifecycle experiment names a control and a candidate model and a ramp plan of
candidate shares (percent): step 0 is the shadow stage (every matching request's user
sees control, a share of them is mirrored to the candidate), later steps are A/B splits
(sticky salted buckets), the last (100 %) sends everyone to the candidate. `render` keeps
the fields the router reads (kind, variants, shadow_model, shadow_share, enabled) in
step with the lifecycle fields, so the router needs no knowledge of ramps.

Every change carries the next version (`next_version`: what its writer read + 1, written by
compare-and-set, llmbus.state.experiment_versions), and every reader keeps the highest version it
has seen (`supersedes`), never simply the last record or the newest clock stamp.

A release (llmbus.domain.release) is the same lifecycle between two versions of one model:
control and candidate name the same model and differ in version, which the variants and the
shadow copies carry.
"""

from __future__ import annotations

from llmbus.contract.messages import Experiment, ExperimentState, Guardrails, RampPlan, Variant, now_ms

CONTROL = "control"
CANDIDATE = "candidate"
ENDED = (ExperimentState.STOPPED, ExperimentState.ROLLED_BACK, ExperimentState.PROMOTED)


class LifecycleError(ValueError):
    pass


def supersedes(incoming: Experiment, current: Experiment | None) -> bool:
    """Whether a reader holding `current` takes `incoming` (the same version again is the same change)."""
    return current is None or incoming.version >= current.version


def newest(read: Experiment, other: Experiment | None) -> Experiment:
    """The higher version of two reads of one experiment (the log's and the compare-and-set's)."""
    return other if other is not None and other.version > read.version else read


def next_version(read: Experiment, changed: Experiment) -> Experiment:
    """`changed` as the change made on `read`: its version follows the one read."""
    return changed.model_copy(update={"version": read.version + 1})


def share_pct(experiment: Experiment) -> float:
    """The candidate's share of user traffic now (0 in shadow, stopped or rolled back)."""
    if experiment.state in (ExperimentState.STOPPED, ExperimentState.ROLLED_BACK):
        return 0.0
    if experiment.state == ExperimentState.PROMOTED:
        return 100.0
    if experiment.ramp is None:
        return 0.0
    return experiment.ramp.steps_pct[min(experiment.step, len(experiment.ramp.steps_pct) - 1)]


def render(experiment: Experiment) -> Experiment:
    """The same experiment with the router-facing fields set from state and step."""
    if experiment.control_model is None or experiment.candidate_model is None:
        return experiment  # a hand-written plain experiment: leave it as it is
    control, candidate = experiment.control_model, experiment.candidate_model
    pct = share_pct(experiment)
    fields: dict[str, object] = {"match_models": [control], "updated_at_ms": now_ms()}
    if experiment.state in (ExperimentState.STOPPED, ExperimentState.ROLLED_BACK):
        fields |= {"enabled": False, "kind": "ab", "variants": _split(experiment, 0.0), "shadow_share": 0.0}
    elif pct <= 0:
        fields |= {
            "enabled": True,
            "kind": "shadow",
            "variants": [],
            "shadow_model": candidate,
            "shadow_version": experiment.candidate_version,
            "shadow_share": experiment.ab_shadow_share,
        }
    else:
        fields |= {
            "enabled": True,
            "kind": "ab",
            "variants": _split(experiment, pct),
            "shadow_model": None,
            "shadow_share": 0.0,
        }
    return experiment.model_copy(update=fields)


def _split(experiment: Experiment, candidate_pct: float) -> list[Variant]:
    assert experiment.control_model is not None and experiment.candidate_model is not None
    return [
        Variant(
            name=CONTROL,
            model=experiment.control_model,
            version=experiment.control_version,
            weight=100.0 - candidate_pct,
        ),
        Variant(
            name=CANDIDATE,
            model=experiment.candidate_model,
            version=experiment.candidate_version,
            weight=candidate_pct,
        ),
    ]


def create(
    experiment_id: str,
    control_model: str,
    candidate_model: str,
    *,
    shadow_share: float = 1.0,
    salt: str = "",
    ramp: RampPlan | None = None,
    guardrails: Guardrails | None = None,
    control_version: str | None = None,
    candidate_version: str | None = None,
    upgrade_id: str | None = None,
) -> Experiment:
    """`control_version`/`candidate_version`: versions of one model (a release, `upgrade_id`)."""
    if (control_model, control_version) == (candidate_model, candidate_version):
        raise LifecycleError("control and candidate must be different models or versions")
    return render(
        Experiment(
            experiment_id=experiment_id,
            kind="shadow",
            salt=salt or experiment_id,
            control_model=control_model,
            candidate_model=candidate_model,
            control_version=control_version,
            candidate_version=candidate_version,
            upgrade_id=upgrade_id,
            ab_shadow_share=shadow_share,
            ramp=ramp or RampPlan(),
            guardrails=guardrails or Guardrails(),
            step=0,
        )
    )


def to_step(experiment: Experiment, step: int, note: str = "") -> Experiment:
    if experiment.ramp is None:
        raise LifecycleError(f"experiment {experiment.experiment_id!r} has no ramp plan")
    if experiment.state in ENDED:
        raise LifecycleError(f"experiment {experiment.experiment_id!r} has ended ({experiment.state.value})")
    last = len(experiment.ramp.steps_pct) - 1
    if not 0 <= step <= last:
        raise LifecycleError(f"step {step} outside the plan (0..{last})")
    state = ExperimentState.PROMOTED if step == last and experiment.ramp.steps_pct[last] >= 100 else experiment.state
    return render(
        experiment.model_copy(update={"step": step, "state": state, "step_started_at_ms": now_ms(), "note": note})
    )


def step_for_share(experiment: Experiment, pct: float) -> int:
    """The plan's step whose share is `pct` (operators ramp by share, the plan counts steps)."""
    if experiment.ramp is None:
        raise LifecycleError(f"experiment {experiment.experiment_id!r} has no ramp plan")
    for i, step_pct in enumerate(experiment.ramp.steps_pct):
        if abs(step_pct - pct) < 1e-9:
            return i
    raise LifecycleError(f"{pct} % is not a step of the plan {experiment.ramp.steps_pct}")


def with_state(experiment: Experiment, state: ExperimentState, note: str = "") -> Experiment:
    if experiment.state in ENDED and state != experiment.state:
        raise LifecycleError(f"experiment {experiment.experiment_id!r} has ended ({experiment.state.value})")
    return render(experiment.model_copy(update={"state": state, "note": note, "step_started_at_ms": now_ms()}))
