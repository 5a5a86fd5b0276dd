"""Model artifacts: the files of one format of a model version, where they live and how to verify them."""

from __future__ import annotations

from pydantic import Field

from llmbus.contract.messages.base import Part


class ArtifactFile(Part):
    """One file of an artifact, verified by its digest after every download."""

    path: str = Field(
        min_length=1, description="Path relative to the artifact's root, '/'-separated (e.g. 'model.safetensors')."
    )
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size_bytes: int = Field(ge=0)


class ModelArtifact(Part):
    """One format of a model version in a model repository (an S3-compatible bucket or a local directory)."""

    format: str = Field(description="bf16 | fp16 | fp8 | awq | gptq | onnx | lora | ...")
    quantization: str | None = Field(default=None, description="e.g. awq-int4, fp8-e4m3; None for full precision.")
    uri: str = Field(
        description="The artifact's root: 's3://<bucket>/<prefix>/' or 'file:///<absolute dir>/'; files are below it."
    )
    files: list[ArtifactFile] = Field(min_length=1)

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)
