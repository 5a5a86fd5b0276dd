"""The model registry's parts: a version's lineage, hardware needs, release plan and lifecycle state.

They extend `ModelSpec` on llm.models (messages/fleet.py): one record per model version (key
`<name>@<version>`) beside the record of the model as served (key `<name>`).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from llmbus.contract.messages.base import Part, now_ms
from llmbus.contract.messages.experiments import Guardrails, RampPlan
from llmbus.contract.messages.release import ReleaseContext

HyperParameter = str | int | float | bool


class ModelState(StrEnum):
    """A version's lifecycle: registered → shadow → canary → serving → retired (llmbus.domain.registry)."""

    REGISTERED = "registered"  # known, its artifacts pushed and verified; serves nobody
    SHADOW = "shadow"  # a release compares it on mirrored copies; users never see its answers
    CANARY = "canary"  # a release gives it a share of users (A/B by user hash)
    SERVING = "serving"  # the model's current version
    RETIRED = "retired"  # replaced or withdrawn; never serves again


class StateTransition(Part):
    """One change of a version's state (or of its share of users within a release), who made it, when and why."""

    from_state: ModelState | None = Field(default=None, description="None: the version's registration")
    to_state: ModelState
    at_ms: int = Field(default_factory=now_ms)
    by: str = Field(description="operator (the CLI's user) or the service that made it (shadow-comparator)")
    reason: str = ""
    release: ReleaseContext | None = Field(
        default=None, description="The release that made it (its upgrade id, versions, stage and share); None: none"
    )


class ModelLineage(Part):
    """Where a version comes from: enough to rebuild it or to explain a regression."""

    training_data_version: str | None = Field(default=None, description="e.g. a dataset tag or its digest")
    training_code_commit: str | None = Field(default=None, description="the training script's commit")
    hyperparameters: dict[str, HyperParameter] = Field(default_factory=dict)
    base_model: str | None = Field(default=None, description="the pre-trained model it was tuned from")
    parent_version: str | None = Field(default=None, description="the version of this model it was derived from")


class HardwareRequirements(Part):
    """What one replica of the version needs to run."""

    min_vram_per_gpu_gib: float | None = Field(default=None, ge=0.0, description="per GPU of the parallel group")
    gpu_count: int = Field(default=1, ge=1, description="GPUs for tensor parallelism")
    cpu_capable: bool = Field(default=False, description="also runs on a CPU-only node (vLLM's CPU build)")


class ReleasePlan(Part):
    """How a release of the version runs (llmbus models release): the ramp, its guardrails, the shadow share."""

    ramp: RampPlan = Field(default_factory=RampPlan)
    guardrails: Guardrails = Field(default_factory=Guardrails)
    shadow_share: float = Field(default=1.0, ge=0.0, le=1.0, description="share of users mirrored in shadow")
