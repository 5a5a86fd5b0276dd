"""The model manifest: what an operator writes to register a model version (`llmbus models register -f`).

YAML (or JSON) validated by `ModelManifest`, whose JSON Schema is schemas/manifest/ModelManifest.json
(llmbus.contract.schemagen). `llmbus models push DIR --manifest FILE` uploads the directory with a
sha256 and size per file and fills `artifacts` itself; `register -f` takes the artifacts as written.

A LoRA adapter is a version like any other, with an `adapter` section naming its base model and rank: its
record's `lora` (llmbus.contract.messages.adapters) is served by the base model's workers, from the files of
its artifact of format `lora` (what `push` uploads for it) or from `adapter.source` when given.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from llmbus.contract.config_file import StrictModel, read_yaml
from llmbus.contract.messages import (
    HardwareRequirements,
    LoraAdapter,
    ModelArtifact,
    ModelFormat,
    ModelLineage,
    ModelSpec,
    ReleasePlan,
)
from llmbus.contract.messages.adapters import ADAPTER_NAME_PATTERN

MANIFEST_VERSION = 1
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$"  # no '@': it separates a name from a version
ADAPTER_FORMAT = "lora"  # an adapter's artifact: adapter_config.json and adapter_model.safetensors


class AdapterSection(StrictModel):
    """The version is a LoRA adapter of `base_model`: served by that model's workers, which load it on demand."""

    base_model: str = Field(min_length=1, max_length=256, description="The model whose workers load it.")
    rank: int = Field(default=8, ge=1, le=512, description="LoRA rank r (a worker loads it if r <= its max rank).")
    source: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description="Where its files are when they were not pushed (a local directory, file:// or s3:// root);"
        " None: its artifact of format lora, which `llmbus models push` uploads.",
    )


class ModelManifest(StrictModel):
    """One model version: what it is, where its files are, what it needs, where it comes from, how to release it."""

    manifest_version: int = Field(default=MANIFEST_VERSION, ge=1, le=MANIFEST_VERSION)
    name: str = Field(min_length=1, max_length=200, pattern=_NAME, description="The model's name clients ask for")
    version: str = Field(min_length=1, max_length=64, pattern=_NAME, description="e.g. 2024-06-01 or 3")
    owner: str = Field(min_length=1, description="team or person answerable for the version")
    description: str = ""
    tier: str | None = Field(default=None, description="The router policy's tier of the model")
    context_length_tokens: int = Field(default=8192, ge=16, description="max model length (prompt + output)")
    max_output_tokens: int = Field(default=4096, ge=1)
    tokenizer: str | None = Field(default=None, description="tokenizer reference (llmbus.tokens) or a URI")
    chat_template: str | None = Field(default=None, description="chat template reference (file or URI)")
    hardware: HardwareRequirements = Field(default_factory=HardwareRequirements)
    lineage: ModelLineage = Field(default_factory=ModelLineage)
    artifacts: list[ModelArtifact] = Field(
        default_factory=list, description="One per format; `llmbus models push` fills it from the uploaded files"
    )
    release: ReleasePlan = Field(default_factory=ReleasePlan, description="ramp and guardrails of its release")
    adapter: AdapterSection | None = Field(
        default=None, description="Set for a LoRA adapter: the version is served on its base model's workers"
    )

    @model_validator(mode="after")
    def _adapter_served_by_its_name(self) -> ModelManifest:
        if self.adapter is not None:
            if not re.match(ADAPTER_NAME_PATTERN, self.name):
                raise ValueError(f"name {self.name!r}: an adapter's served name matches {ADAPTER_NAME_PATTERN}")
            if self.adapter.base_model == self.name:
                raise ValueError(f"adapter.base_model: an adapter is not its own base ({self.name!r})")
        return self

    @property
    def default_format(self) -> str:
        """The format `llmbus models push` gives the pushed files when it is told none."""
        return ADAPTER_FORMAT if self.adapter is not None else "bf16"

    def lora(self) -> LoraAdapter | None:
        """The adapter the version is (None for a model). ValueError when an adapter has no files to load."""
        if self.adapter is None:
            return None
        pushed = next((a.uri for a in self.artifacts if a.format == ADAPTER_FORMAT), None)
        source = pushed or self.adapter.source
        if source is None:
            raise ValueError(
                f"{self.name}@{self.version} is an adapter without files: push its directory (llmbus models push),"
                f" list an artifact of format {ADAPTER_FORMAT!r}, or give adapter.source"
            )
        return LoraAdapter(
            name=self.name,
            base_model=self.adapter.base_model,
            source=source,
            rank=self.adapter.rank,
            version=self.version,
        )

    def spec(self) -> ModelSpec:
        """The version's registry record (not yet registered: llmbus.domain.registry.registered sets its state).

        An adapter's record carries its LoraAdapter, no formats of its own (it runs on its base model's) and
        its base model in the lineage when the lineage names none."""
        lora = self.lora()
        lineage = self.lineage
        if self.adapter is not None and lineage.base_model is None:
            lineage = lineage.model_copy(update={"base_model": self.adapter.base_model})
        formats = (
            [] if lora is not None else [ModelFormat(name=a.format, weight_bytes=a.size_bytes) for a in self.artifacts]
        )
        return ModelSpec(
            name=self.name,
            version=self.version,
            record="version",
            tier=self.tier,
            max_model_len=self.context_length_tokens,
            max_output_tokens=min(self.max_output_tokens, self.context_length_tokens),
            formats=formats,
            tokenizer=self.tokenizer,
            artifacts=self.artifacts,
            chat_template=self.chat_template,
            hardware=self.hardware,
            lineage=lineage,
            owner=self.owner,
            release_plan=self.release,
            lora=lora,
        )


def load_manifest(path: Path, overrides: Sequence[str] = ()) -> ModelManifest:
    """The manifest in `path` (YAML or JSON); pydantic's ValidationError names the field when it is wrong.

    `overrides`: `KEY=VALUE` items set over the file's values before it is validated, a dotted KEY
    reaching into a section (`version=7`, `lineage.parent_version=6`): a pipeline stamps its build's
    version on a manifest kept in the repository. VALUE is text, turned into a number where the field is one."""
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a manifest is a mapping of its fields")
    for item in overrides:
        key, equals, value = item.partition("=")
        if not (key and equals):
            raise ValueError(f"{item!r}: expected KEY=VALUE (a dotted KEY for a section's field: lineage.base_model=x)")
        _set(raw, key.split("."), value)
    return ModelManifest.model_validate(raw)


def _set(raw: dict[str, Any], path: list[str], value: str) -> None:
    *sections, field = path
    for section in sections:
        inner = raw.setdefault(section, {})
        if not isinstance(inner, dict):
            raise ValueError(f"{'.'.join(path)}: {section} is not a section")
        raw = inner
    raw[field] = value
