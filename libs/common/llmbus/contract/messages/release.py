"""Which release a data point belongs to: one Part every message of the request path and its analytics carries."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from llmbus.contract.messages.base import Part


class ReleaseStage(StrEnum):
    SHADOW = "shadow"  # the new version is compared on mirrored copies; users see the previous one
    AB = "ab"  # users are split by a salted hash of their id; share_pct is the new version's share
    SERVING = "serving"  # the version serves everyone (the release was promoted, or it was the first)
    ROLLED_BACK = "rolled_back"  # the release ended without promotion; users are back on the previous version


class ReleaseContext(Part):
    """The release (upgrade) a data point was produced under, so every record can be traced to it.

    On a request's records (routed request, result, final chunk, cost record, comparison) `model_version`
    is the version that answered: the new one's, or the previous one's when the user was on control
    (then it equals `previous_version`). On a release's own records (experiment decision, scaling
    decision, pool statistics) it is the version the release rolls out.
    """

    upgrade_id: str = Field(min_length=1, max_length=128, description="The release's id (llmbus models release).")
    model_version: str = Field(min_length=1, max_length=128)
    previous_version: str | None = Field(
        default=None, max_length=128, description="The version the release replaces; None for a model's first."
    )
    stage: ReleaseStage
    share_pct: float = Field(default=100.0, ge=0.0, le=100.0, description="The new version's share of users now.")

    @property
    def on_previous(self) -> bool:
        """This data point came from the version being replaced (the control side of the release)."""
        return self.previous_version is not None and self.model_version == self.previous_version

    def label(self) -> str:
        """`shadow`, `ab 25%`, `serving`, `rolled_back`: how the CLI and dashboards name the stage."""
        return f"ab {self.share_pct:g}%" if self.stage == ReleaseStage.AB else self.stage.value
