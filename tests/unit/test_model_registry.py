"""The registry's rules: version keys, the state machine, a release's steps in the registry, its history."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from llmbus.contract.manifest import ModelManifest, load_manifest
from llmbus.contract.messages import (
    ExperimentState,
    ModelLineage,
    ModelSpec,
    ModelState,
    RampPlan,
    ReleasePlan,
    ReleaseStage,
)
from llmbus.domain.lifecycle import CANDIDATE, CONTROL, render, to_step, with_state
from llmbus.domain.registry import (
    ModelVersions,
    RegistryError,
    by_model,
    parse_ref,
    registered,
    transition,
)
from llmbus.domain.release import context_for, follow, history, start

RAMP = ReleasePlan(ramp=RampPlan(steps_pct=[0, 50, 100], min_samples_per_step=1, min_step_s=0))


def version(v: str, parent: str | None = None) -> ModelSpec:
    manifest = ModelManifest(
        name="tiny",
        version=v,
        owner="ml",
        lineage=ModelLineage(training_data_version=f"data-{v}", parent_version=parent),
        release=RAMP,
    )
    return registered(manifest.spec(), by="alice", reason="test")


def registry(*records: ModelSpec) -> ModelVersions:
    return by_model({r.key: r for r in records})["tiny"]


def apply(model: ModelVersions, records: list[ModelSpec]) -> ModelVersions:
    table = {r.key: r for r in [*model.versions.values(), *([model.serving] if model.serving else [])]}
    table |= {r.key: r for r in records}
    return by_model(table)["tiny"]


def test_keys_and_refs() -> None:
    v = version("2")
    assert v.key == "tiny@2" and v.record == "version" and v.state == ModelState.REGISTERED
    assert ModelSpec(name="tiny").key == "tiny"
    assert parse_ref("tiny@2") == ("tiny", "2") and parse_ref("tiny") == ("tiny", None)
    for bad in ("@2", "tiny@", ""):
        with pytest.raises(RegistryError):
            parse_ref(bad)


def test_state_machine_refuses_skips_and_returns() -> None:
    v = version("1")
    with pytest.raises(RegistryError, match="registered → registered"):
        transition(v, ModelState.REGISTERED, by="x")
    serving = transition(v, ModelState.SERVING, by="x", reason="first")
    retired = transition(serving, ModelState.RETIRED, by="x")
    for target in ModelState:
        with pytest.raises(RegistryError):
            transition(retired, target, by="x")  # retired is final
    with pytest.raises(RegistryError):
        transition(serving, ModelState.SHADOW, by="x")  # a serving version is only ever retired
    assert [c.to_state for c in retired.transitions] == [ModelState.REGISTERED, ModelState.SERVING, ModelState.RETIRED]
    assert [c.from_state for c in retired.transitions] == [None, ModelState.REGISTERED, ModelState.SERVING]
    with pytest.raises(RegistryError, match="not a registry version record"):
        transition(ModelSpec(name="plain"), ModelState.SERVING, by="x")


def test_first_version_serves_at_once_the_second_is_released_and_promoted() -> None:
    model = registry(version("1"), version("2", parent="1"))
    first = start(model, "1", by="alice", upgrade_id="upg-1")
    assert first.experiment is None
    v1, serving = first.records
    assert v1.state == ModelState.SERVING and serving.key == "tiny" and serving.record == "serving"
    assert serving.release is not None and serving.release.previous_version is None
    model = apply(model, first.records)

    second = start(model, "2", by="alice", upgrade_id="upg-2")
    experiment = second.experiment
    assert experiment is not None and experiment.experiment_id == "upg-2" and experiment.upgrade_id == "upg-2"
    assert (experiment.control_model, experiment.candidate_model) == ("tiny", "tiny")
    assert (experiment.control_version, experiment.candidate_version) == ("1", "2")
    assert experiment.kind == "shadow" and experiment.shadow_version == "2" and experiment.ramp == RAMP.ramp
    [shadow] = second.records
    assert shadow.state == ModelState.SHADOW and shadow.release is not None
    assert shadow.release.stage == ReleaseStage.SHADOW and shadow.release.previous_version == "1"
    model = apply(model, second.records)
    with pytest.raises(RegistryError, match="being released"):
        start(model, "2", by="alice")

    ab = to_step(experiment, 1)
    assert [(v.name, v.model, v.version, v.weight) for v in ab.variants] == [
        (CONTROL, "tiny", "1", 50.0),
        (CANDIDATE, "tiny", "2", 50.0),
    ]
    [canary] = follow(ab, model, by="shadow-comparator", reason="guardrails hold")
    assert canary.state == ModelState.CANARY and canary.release is not None and canary.release.share_pct == 50
    model = apply(model, [canary])
    assert follow(ab, model, by="shadow-comparator") == []  # the same step written again adds nothing

    promoted = to_step(ab, 2)
    assert promoted.state == ExperimentState.PROMOTED and promoted.enabled  # everyone on 2, as the registry says
    assert [(v.version, v.weight) for v in promoted.variants] == [("1", 0.0), ("2", 100.0)]
    records = follow(promoted, model, by="shadow-comparator", reason="all steps passed")
    assert [(r.key, r.state) for r in records] == [
        ("tiny@2", ModelState.SERVING),
        ("tiny", ModelState.SERVING),
        ("tiny@1", ModelState.RETIRED),
    ]
    assert records[1].version == "2" and records[1].release == records[0].release
    assert records[2].transitions[-1].reason == "replaced by 2 (upg-2)"
    model = apply(model, records)

    [first_release, second_release] = history(model)
    assert (first_release.upgrade_id, first_release.outcome) == ("upg-1", "served (first version)")
    assert (second_release.version, second_release.previous_version, second_release.outcome) == ("2", "1", "promoted")
    assert [s.release.label() for s in second_release.steps if s.release] == ["shadow", "ab 50%", "serving"]
    assert second_release.ended_at_ms is not None


def test_a_rollback_sends_the_candidate_back_and_keeps_the_serving_version() -> None:
    model = registry(version("1"), version("2"))
    model = apply(model, start(model, "1", by="a", upgrade_id="upg-1").records)
    begun = start(model, "2", by="a", upgrade_id="upg-2")
    assert begun.experiment is not None
    model = apply(model, begun.records)
    rolled = with_state(begun.experiment, ExperimentState.ROLLED_BACK, note="similarity below the floor")
    [back] = follow(rolled, model, by="shadow-comparator", reason="similarity below the floor")
    assert back.state == ModelState.REGISTERED and back.release is not None
    assert back.release.stage == ReleaseStage.ROLLED_BACK and back.release.share_pct == 0
    model = apply(model, [back])
    assert model.serving is not None and model.serving.version == "1"
    assert model.versions["1"].state == ModelState.SERVING
    [_, release] = history(model)
    assert release.outcome == "rolled back" and release.reason == "similarity below the floor"
    # Rolled back, it may be released again later (a new upgrade id).
    again = start(model, "2", by="a", upgrade_id="upg-3")
    assert again.experiment is not None and again.records[0].state == ModelState.SHADOW


def test_start_refuses_what_cannot_be_released() -> None:
    model = registry(version("1"))
    with pytest.raises(RegistryError, match="not registered"):
        start(model, "9", by="a")
    served = apply(model, start(model, "1", by="a").records)
    with pytest.raises(RegistryError, match="only a registered version"):
        start(served, "1", by="a")


def test_release_context_of_each_side_and_stage() -> None:
    model = registry(version("1"), version("2"))
    model = apply(model, start(model, "1", by="a").records)
    experiment = start(model, "2", by="a", upgrade_id="upg-2").experiment
    assert experiment is not None
    control, candidate = context_for(experiment, CONTROL), context_for(experiment, CANDIDATE)
    assert control is not None and candidate is not None
    assert (control.model_version, control.previous_version, control.on_previous) == ("1", "1", True)
    assert (candidate.model_version, candidate.previous_version, candidate.on_previous) == ("2", "1", False)
    assert candidate.label() == "shadow" and context_for(to_step(experiment, 1), CANDIDATE).label() == "ab 50%"  # type: ignore[union-attr]
    plain = render(experiment.model_copy(update={"upgrade_id": None, "candidate_version": None}))
    assert context_for(plain, CANDIDATE) is None


def test_manifest_spec_carries_lineage_artifacts_and_limits() -> None:
    manifest = ModelManifest.model_validate(
        {
            "name": "tiny",
            "version": "3",
            "owner": "ml",
            "context_length_tokens": 2048,
            "max_output_tokens": 4096,
            "hardware": {"min_vram_per_gpu_gib": 1.5, "gpu_count": 2, "cpu_capable": True},
            "lineage": {
                "training_data_version": "ds-7",
                "training_code_commit": "abc123",
                "hyperparameters": {"lr": 0.0003, "epochs": 2},
                "base_model": "llama",
                "parent_version": "2",
            },
            "artifacts": [
                {
                    "format": "bf16",
                    "uri": "file:///models/tiny/3/bf16/",
                    "files": [{"path": "model.safetensors", "sha256": "a" * 64, "size_bytes": 10}],
                }
            ],
        }
    )
    spec = manifest.spec()
    assert spec.max_model_len == 2048 and spec.max_output_tokens == 2048  # never more than the window
    assert spec.formats[0].name == "bf16" and spec.formats[0].weight_bytes == 10
    assert spec.lineage is not None and spec.lineage.hyperparameters == {"lr": 0.0003, "epochs": 2}
    with pytest.raises(ValueError, match="extra"):
        ModelManifest.model_validate({"name": "t", "version": "1", "owner": "o", "tokeniser": "x"})
    with pytest.raises(ValueError):
        ModelManifest.model_validate({"name": "t@1", "version": "1", "owner": "o"})  # '@' separates versions


def test_manifest_overrides_stamp_a_version_on_the_file_and_are_validated_like_it(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("name: tiny\nversion: '1'\nowner: ml\nlineage: {base_model: llama}\ncontext_length_tokens: 512\n")
    stamped = load_manifest(path, ["version=7", "lineage.parent_version=6", "context_length_tokens=256", "name=tiny-b"])
    assert (stamped.name, stamped.version, stamped.context_length_tokens) == ("tiny-b", "7", 256)
    assert (stamped.lineage.parent_version, stamped.lineage.base_model) == ("6", "llama")  # the section kept
    assert load_manifest(path, ["release.shadow_share=0.5"]).release.shadow_share == 0.5  # a section not in the file
    assert load_manifest(path).version == "1"
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        load_manifest(path, ["version"])
    with pytest.raises(ValueError, match="not a section"):
        load_manifest(path, ["version.major=2"])
    with pytest.raises(ValidationError, match="colour"):
        load_manifest(path, ["colour=blue"])  # an unknown field, as in the file
    with pytest.raises(ValidationError, match="version"):
        load_manifest(path, ["version=a@b"])  # no '@' in a version
