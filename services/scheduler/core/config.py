"""The placement pipeline file (YAML), validated by strict pydantic models before the scheduler places anything.

A key out of place is an error, not a default: `filter:` for `filters:` used to give a pipeline
without its filters, which placed requests on any worker, whatever model it served. Each
plugin's `params` are checked against the plugin's own fields and their types.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from pydantic import Field, TypeAdapter, ValidationError, model_validator

from llmbus.contract.config_file import StrictModel
from llmbus_services.scheduler.core.plugins import FILTERS, PICKERS, SCORERS
from llmbus_services.scheduler.core.plugins.base import PluginFactory

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
        for kind, registry, specs in (
            ("filter", FILTERS, self.filters),
            ("scorer", SCORERS, self.scorers),
            ("picker", PICKERS, [self.picker]),
        ):
            for spec in specs:
                build_plugin(registry, spec, kind)  # raises on an unknown type or a bad param
        if REQUIRED_FILTER not in {f.type for f in self.filters}:
            raise ValueError(f"pipeline {self.name!r}: filters must include {REQUIRED_FILTER!r}")
        return self


def build_plugin(registry: dict[str, PluginFactory], spec: PluginSpec, kind: str) -> Any:
    """The plugin `spec` names, with its params validated against the plugin's fields (strictly typed)."""
    factory = registry.get(spec.type)
    if factory is None:
        raise ValueError(f"unknown {kind} plugin {spec.type!r}; known: {sorted(registry)}")
    if not (isinstance(factory, type) and dataclasses.is_dataclass(factory)):
        try:
            return factory(**spec.params)
        except TypeError as exc:
            raise ValueError(f"{kind} {spec.type!r}: {exc}") from exc
    settable = {
        f.name for f in dataclasses.fields(factory) if f.init and f.name != "name" and not f.name.startswith("_")
    }
    unknown = sorted(set(spec.params) - settable)
    if unknown:
        raise ValueError(f"{kind} {spec.type!r}: unknown params {unknown}; it takes {sorted(settable)}")
    hints = typing.get_type_hints(factory)
    params = {}
    for key, value in spec.params.items():
        try:  # strict: `kv_headroom: "1.0"` is a mistake in the file, not a float
            params[key] = TypeAdapter(hints[key]).validate_python(value, strict=True)
        except ValidationError as exc:
            raise ValueError(f"{kind} {spec.type!r}: param {key!r}: {exc.errors()[0]['msg']}") from exc
    return factory(**params)
