"""`llmbus models` against the real broker: a manifest pushed (file://) and registered, shown with its
lineage, released (a first version at once, a second into shadow), rolled back, its history, retired."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmbus.bus.tables import read_table
from llmbus.cli import models as models_cli
from llmbus.cli.main import app
from llmbus.contract import topics as t
from llmbus.contract.messages import Experiment, ExperimentState, ModelSpec, ModelState
from llmbus.settings import BusSettings

pytestmark = [pytest.mark.kafka, pytest.mark.redis]  # release, rollback, ramp: compare-and-set in Redis


def invoke(settings: BusSettings, *args: str, code: int = 0) -> str:
    env = {"LLMBUS_TOPIC_PREFIX": settings.topic_prefix}
    models_cli.console.width = 220  # its tables unwrapped, whatever terminal the tests run in
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == code, result.output + repr(result.exception)
    return result.output


def table(settings: BusSettings, base: str, model: type) -> dict:  # type: ignore[type-arg]
    return asyncio.run(read_table(settings, t.Topics(settings.topic_prefix).name(base), model))


def manifest(path: Path, version: str, parent: str | None, **more: object) -> Path:
    body = {
        "name": "tiny",
        "version": version,
        "owner": "ml-platform",
        "context_length_tokens": 2048,
        "max_output_tokens": 256,
        "hardware": {"min_vram_per_gpu_gib": 0.5, "gpu_count": 1, "cpu_capable": True},
        "lineage": {
            "training_data_version": f"chats-2024-0{version}",
            "training_code_commit": f"c0ffee{version}",
            "hyperparameters": {"learning_rate": 0.0003, "epochs": int(version)},
            "base_model": "tiny-base",
            "parent_version": parent,
        },
        "release": {"ramp": {"steps_pct": [0, 50, 100], "min_samples_per_step": 10, "min_step_s": 0}},
    } | more
    path.write_text(yaml.safe_dump(body))
    return path


def test_push_register_show_release_rollback_history(bus_settings: BusSettings, tmp_path: Path) -> None:
    s = bus_settings
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text('{"hidden_size": 128}')
    (weights / "model.safetensors").write_bytes(b"\x01" * 4096)
    repo = tmp_path / "repo"

    out = invoke(
        s, "models", "push", str(weights), "-f", str(manifest(tmp_path / "v1.yaml", "1", None)), "--to", repo.as_uri()
    )
    assert "pushed 2 files" in out and "registered tiny@1" in out
    v1 = table(s, t.MODELS, ModelSpec)["tiny@1"]
    assert v1.state == ModelState.REGISTERED and v1.record == "version" and v1.owner == "ml-platform"
    [artifact] = v1.artifacts
    assert artifact.uri == f"{repo.as_uri()}/tiny/1/bf16/"
    for f in artifact.files:
        assert hashlib.sha256((repo / "tiny/1/bf16" / f.path).read_bytes()).hexdigest() == f.sha256
    invoke(s, "models", "push", str(weights), "-f", str(tmp_path / "v1.yaml"), "--to", repo.as_uri(), code=2)

    files = [{"path": "model.safetensors", "sha256": "b" * 64, "size_bytes": 4096}]
    by_hand = [{"format": "bf16", "uri": f"{repo.as_uri()}/tiny/2/bf16/", "files": files}]
    invoke(s, "models", "register", "-f", str(manifest(tmp_path / "v2.yaml", "2", "1", artifacts=by_hand)))
    invoke(s, "models", "register", "-f", str(tmp_path / "v2.yaml"), code=2)  # a version never changes
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: tiny\nversion: '3'\nowner: x\ncontext_lenght_tokens: 5\n")
    assert "context_lenght_tokens" in invoke(s, "models", "register", "-f", str(bad), code=2)

    shown = invoke(s, "models", "show", "tiny@2")
    for fact in ("chats-2024-02", "c0ffee2", "epochs=2", "learning_rate=0.0003", "tiny-base", "parent: tiny@1"):
        assert fact in shown, (fact, shown)
    assert "chats-2024-01" in shown and "c0ffee1" in shown  # the parent's lineage, followed

    assert "serving (first version)" in invoke(s, "models", "release", "tiny@1")
    models = table(s, t.MODELS, ModelSpec)
    assert models["tiny"].record == "serving" and models["tiny"].version == "1"
    assert "shadow" in invoke(s, "models", "release", "tiny@2")
    models = table(s, t.MODELS, ModelSpec)
    v2 = models["tiny@2"]
    assert v2.state == ModelState.SHADOW and v2.release is not None
    upgrade = v2.release.upgrade_id
    experiment = table(s, t.EXPERIMENTS, Experiment)[upgrade]
    assert (experiment.control_version, experiment.candidate_version, experiment.shadow_version) == ("1", "2", "2")
    assert experiment.ramp is not None and experiment.ramp.steps_pct == [0, 50, 100]  # the manifest's plan
    listed = invoke(s, "models", "list")
    assert "1 (serving)" in listed and "2 (shadow)" in listed
    invoke(s, "models", "release", "tiny@2", code=2)  # one release at a time

    assert "rolled back tiny@2" in invoke(s, "models", "rollback", "tiny", "--reason", "bad answers")
    models = table(s, t.MODELS, ModelSpec)
    assert models["tiny@2"].state == ModelState.REGISTERED and models["tiny"].version == "1"
    stopped = table(s, t.EXPERIMENTS, Experiment)[upgrade]
    assert stopped.state == ExperimentState.STOPPED and not stopped.enabled

    history = invoke(s, "models", "history", "tiny")
    assert "served (first version)" in history and "rolled back" in history and upgrade in history
    assert "bad answers" in history

    invoke(s, "models", "retire", "tiny@1", code=2)  # the serving version is retired by a release only

    # Released again; an operator ramps it by hand (`llmbus experiments ramp`): the registry follows.
    invoke(s, "models", "release", "tiny@2")
    again = table(s, t.MODELS, ModelSpec)["tiny@2"].release
    assert again is not None and again.upgrade_id != upgrade
    invoke(s, "experiments", "ramp", again.upgrade_id, "--to", "50")
    models = table(s, t.MODELS, ModelSpec)
    assert models["tiny@2"].state == ModelState.CANARY and models["tiny"].version == "1"
    invoke(s, "experiments", "ramp", again.upgrade_id, "--to", "100")
    models = table(s, t.MODELS, ModelSpec)
    assert (models["tiny@2"].state, models["tiny@1"].state) == (ModelState.SERVING, ModelState.RETIRED)
    assert models["tiny"].version == "2" and models["tiny@2"].transitions[-1].by != "shadow-comparator"
    assert table(s, t.EXPERIMENTS, Experiment)[again.upgrade_id].enabled  # still routes everyone to 2

    # The next release closes that one just before its own experiment starts.
    invoke(s, "models", "register", "-f", str(manifest(tmp_path / "v3.yaml", "3", "2", artifacts=by_hand)))
    invoke(s, "models", "release", "tiny@3")
    third = table(s, t.MODELS, ModelSpec)["tiny@3"].release
    assert third is not None
    experiments = table(s, t.EXPERIMENTS, Experiment)
    assert not experiments[again.upgrade_id].enabled and experiments[third.upgrade_id].enabled
    assert (experiments[third.upgrade_id].control_version, experiments[third.upgrade_id].candidate_version) == (
        "2",
        "3",
    )
    history = invoke(s, "models", "history", "tiny")
    assert history.count("promoted") == 1 and "in progress" in history

    invoke(s, "models", "rollback", "tiny")
    invoke(s, "models", "retire", "tiny@3")
    assert table(s, t.MODELS, ModelSpec)["tiny@3"].state == ModelState.RETIRED
    invoke(s, "models", "release", "tiny@3", code=2)
