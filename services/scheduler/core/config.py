"""The placement pipeline file (YAML), validated by strict pydantic models before the scheduler places anything.

A key out of place is an error, not a default: `filter:` for `filters:` used to give a pipeline
without its filters, which placed requests on any worker, whatever model it served. Each
plugin's `params` are checked against the plugin's own fields and their types.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from llmbus.contract.config_file import StrictModel
from llmbus_services.scheduler.core.plugins import FILTERS, PICKERS, SCORERS

# Without it a worker is picked whatever models it serves: every pipeline keeps it.
REQUIRED_FILTER = "serves-model"


class PluginSpec(StrictModel):
    type: str
    params: dict[str, Any] = Field(default_factory=dict)


class ScorerSpec(PluginSpec):
    weight: float = Field(default=1.0, ge=0)


class PipelineConfig(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    filters: list[PluginSpec] = Field(min_length=1)
    scorers: list[ScorerSpec] = Field(default_factory=list)
    picker: PluginSpec = Field(default_factory=lambda: PluginSpec(type="max-score"))

    @model_validator(mode="after")
    def _plugins_known(self) -> PipelineConfig:
        for registry, specs in ((FILTERS, self.filters), (SCORERS, self.scorers), (PICKERS, [self.picker])):
            for spec in specs:
                registry.check(spec.type, spec.params)  # raises on an unknown type or a bad param
        if REQUIRED_FILTER not in {f.type for f in self.filters}:
            raise ValueError(f"pipeline {self.name!r}: filters must include {REQUIRED_FILTER!r}")
        return self
