"""The one plugin registry (llmbus.contract.plugins): names, strictly checked params, what the service gives;
and every service's plugins are found through one."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmbus.contract.plugins import Registry
from llmbus_services.autoscaler.adapters.actuators import ACTUATORS
from llmbus_services.autoscaler.core.base import POLICIES
from llmbus_services.engine_worker.adapters.engines.factory import ENGINES
from llmbus_services.router.adapters.embedders import EMBEDDERS
from llmbus_services.router.core.complexity import SCORERS as COMPLEXITY_SCORERS
from llmbus_services.router.core.complexity import scorer_names
from llmbus_services.scheduler.core.plugins import FILTERS, PICKERS, SCORERS


class Widget:
    def __init__(self, size: int, label: str = "w", *, scale: float = 1.0) -> None:
        self.size, self.label, self.scale = size, label, scale


@dataclass
class Gadget:
    name = "gadget"
    depth: int = 1
    _cache: int = 0


class GizmoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    depth: int = Field(default=1, ge=1)
    width: int = Field(default=2, ge=1)

    @model_validator(mode="after")
    def _deeper_than_wide(self) -> GizmoParams:
        if self.depth < self.width:
            raise ValueError("depth must be at least width")
        return self


@dataclass
class Gizmo:
    """A plugin whose params need ranges and a rule between them: a pydantic `Params` model."""

    Params = GizmoParams
    size: int
    params: GizmoParams = field(default_factory=GizmoParams)


def registry() -> Registry[object]:
    things: Registry[object] = Registry("thing")
    things.register("widget")(Widget)
    things.register("gadget")(Gadget)
    things.register("gizmo")(Gizmo)
    return things


def test_a_plugin_is_built_by_name_with_its_params_checked_strictly() -> None:
    things = registry()
    widget = things.build("widget", {"size": 3, "scale": 2})
    assert isinstance(widget, Widget) and (widget.size, widget.scale) == (3, 2.0)
    with pytest.raises(ValueError, match=r"unknown thing 'nope'; known: \['gadget', 'gizmo', 'widget'\]"):
        things.build("nope")
    with pytest.raises(ValueError, match=r"thing 'widget': unknown params \['colour'\]"):
        things.build("widget", {"size": 1, "colour": "red"})
    with pytest.raises(ValueError, match="thing 'widget': param 'size'"):
        things.build("widget", {"size": "3"})  # a string in the file where a number belongs
    with pytest.raises(ValueError, match=r"thing 'widget'.*size"):
        things.build("widget", {})  # required and left out
    with pytest.raises(ValueError, match=r"unknown params \['_cache'\]"):
        things.build("gadget", {"_cache": 1})  # a dataclass's private fields are not settable


def test_what_the_service_gives_is_passed_unchecked_and_not_settable_from_a_file() -> None:
    things = registry()
    widget = things.build("widget", {"label": "x"}, size=7)
    assert isinstance(widget, Widget) and (widget.size, widget.label) == (7, "x")
    with pytest.raises(ValueError, match="unknown params"):
        things.check("widget", {"size": 1}, "size")


def test_a_params_model_checks_ranges_and_rules_and_is_passed_whole() -> None:
    things = registry()
    gizmo = things.build("gizmo", {"depth": 5, "width": 3}, size=7)
    assert isinstance(gizmo, Gizmo) and gizmo.size == 7 and gizmo.params == GizmoParams(depth=5, width=3)
    with pytest.raises(ValueError, match=r"thing 'gizmo': unknown params \['colour'\]; it takes \['depth', 'width'\]"):
        things.build("gizmo", {"colour": "red"}, size=1)
    with pytest.raises(ValueError, match="thing 'gizmo': param 'depth': Input should be greater than or equal to 1"):
        things.build("gizmo", {"depth": 0}, size=1)
    with pytest.raises(ValueError, match="thing 'gizmo': Value error, depth must be at least width"):
        things.build("gizmo", {"depth": 2, "width": 3}, size=1)
    with pytest.raises(ValueError, match="unknown params"):
        things.check("gizmo", {"size": 1}, "size")  # what the service gives is not a param


def test_a_name_is_registered_once() -> None:
    things = registry()
    with pytest.raises(ValueError, match="registered twice"):
        things.register("widget")(Widget)


def test_every_service_finds_its_plugins_through_a_registry() -> None:
    """One idiom: placement plugins, complexity scorers, embedders, scaling policies, actuators, engines."""
    assert {"serves-model", "fits-capacity", "serves-adapter", "capable-hardware", "node-health"} <= set(
        FILTERS.names()
    )
    assert {"queue-depth", "prefix-affinity", "adapter-affinity", "smallest-capable"} <= set(SCORERS.names())
    assert "max-score" in PICKERS
    assert {"constant", "heuristic", "learned"} <= set(scorer_names()) == set(COMPLEXITY_SCORERS.names())
    assert EMBEDDERS.names() == ["wordllama"]
    assert POLICIES.names() == ["predictive", "threshold"]
    assert ACTUATORS.names() == ["kubernetes", "local", "none"]
    assert ENGINES.names() == ["onnx", "openai-http", "sim", "vllm"]
    with pytest.raises(ValueError, match="scaling policy 'threshold': unknown params"):
        POLICIES.check("threshold", {"bogus": 1}, "bounds")
    with pytest.raises(ValueError, match=r"scaling policy 'predictive': param 'engine\.prefill_us_per_token'"):
        POLICIES.check("predictive", {"engine": {"step_base_us": 1000, "decode_us_per_seq": 5}}, "bounds")
