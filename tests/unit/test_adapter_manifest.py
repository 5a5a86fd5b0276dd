"""An adapter's manifest: its `adapter` section becomes the registered ModelSpec's LoraAdapter, served from the
pushed artifact's root (format lora), with the version's lineage; what cannot be an adapter is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from llmbus.contract.manifest import ModelManifest, load_manifest
from llmbus.contract.messages import ArtifactFile, ModelArtifact

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny-llama-ops-lora.yaml"


def adapter_manifest(**more: object) -> ModelManifest:
    body = {
        "name": "tiny-ops",
        "version": "2",
        "owner": "ml-platform",
        "adapter": {"base_model": "tiny-llama", "rank": 8},
        "lineage": {
            "training_data_version": "ops-chats-2024-06",
            "training_code_commit": "c0ffee2",
            "hyperparameters": {"r": 8, "lora_alpha": 16, "learning_rate": 0.0002},
            "parent_version": "1",
        },
    } | more
    return ModelManifest.model_validate(body)


def lora_artifact(uri: str = "s3://models/tiny-ops/2/lora/") -> ModelArtifact:
    files = [
        ArtifactFile(path="adapter_config.json", sha256="a" * 64, size_bytes=600),
        ArtifactFile(path="adapter_model.safetensors", sha256="b" * 64, size_bytes=40_000),
    ]
    return ModelArtifact(format="lora", uri=uri, files=files)


def test_the_pushed_artifact_is_the_adapters_source_and_the_lineage_names_its_base() -> None:
    manifest = adapter_manifest()
    assert manifest.default_format == "lora"
    spec = manifest.model_copy(update={"artifacts": [lora_artifact()]}).spec()
    lora = spec.lora
    assert lora is not None
    assert (lora.name, lora.base_model, lora.rank, lora.version) == ("tiny-ops", "tiny-llama", 8, "2")
    assert lora.source == "s3://models/tiny-ops/2/lora/"
    assert spec.record == "version" and spec.key == "tiny-ops@2" and spec.formats == []  # runs on its base's
    assert spec.artifacts == [lora_artifact()] and spec.artifacts[0].size_bytes == 40_600
    assert spec.lineage is not None
    assert (spec.lineage.base_model, spec.lineage.parent_version) == ("tiny-llama", "1")
    assert spec.lineage.training_code_commit == "c0ffee2" and spec.lineage.hyperparameters["lora_alpha"] == 16


def test_an_adapter_kept_elsewhere_is_registered_by_its_source_and_a_lineage_base_stands() -> None:
    manifest = adapter_manifest(
        adapter={"base_model": "tiny-llama", "rank": 16, "source": "file:///srv/adapters/ops/"},
        lineage={"base_model": "tiny-llama-instruct"},
    )
    spec = manifest.spec()
    assert spec.lora is not None and spec.lora.source == "file:///srv/adapters/ops/" and spec.lora.rank == 16
    assert spec.lineage is not None and spec.lineage.base_model == "tiny-llama-instruct"
    pushed = manifest.model_copy(update={"artifacts": [lora_artifact()]}).spec()
    assert pushed.lora is not None and pushed.lora.source == "s3://models/tiny-ops/2/lora/"  # the push wins


def test_a_model_manifest_has_no_adapter() -> None:
    manifest = ModelManifest.model_validate({"name": "tiny", "version": "1", "owner": "x"})
    assert manifest.default_format == "bf16" and manifest.spec().lora is None


def test_what_cannot_be_an_adapter_is_refused() -> None:
    with pytest.raises(ValueError, match="an adapter without files"):
        adapter_manifest().spec()  # neither pushed nor given a source
    with pytest.raises(ValidationError, match="served name"):
        adapter_manifest(name="team/tiny-ops")  # a model name may hold '/', an adapter's served name not
    with pytest.raises(ValidationError, match="not its own base"):
        adapter_manifest(adapter={"base_model": "tiny-ops"})
    with pytest.raises(ValidationError, match="rank"):
        adapter_manifest(adapter={"base_model": "tiny-llama", "rank": 0})
    with pytest.raises(ValidationError, match="extra"):
        adapter_manifest(adapter={"base_model": "tiny-llama", "alpha": 16})


def test_the_example_adapter_manifest_loads_and_stamps_a_version() -> None:
    manifest = load_manifest(EXAMPLE, ["version=3", "lineage.parent_version=2"])
    assert manifest.adapter is not None and manifest.adapter.base_model == "tiny-llama"
    assert manifest.version == "3" and manifest.lineage.parent_version == "2"
    spec = manifest.model_copy(update={"artifacts": [lora_artifact("s3://llmbus-models/tiny-llama-ops/3/lora/")]})
    assert spec.spec().lora is not None
