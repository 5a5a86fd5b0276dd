"""The scaling-policy interface, its decision, and the registry the pool YAML names policies by.

A policy is fed one pool's `PoolSignals` in time order (the clock is `signals.now_ms`, so
tests and the benchmark drive it in virtual time) and answers how many replicas the pool
should have. It keeps its own timers (sustained-high, idle, cooldown, forecast history).

Each policy is a plugin (llmbus.contract.plugins): a class registered under its YAML name with a
strict pydantic `Params` model, so a pool file's `params:` are checked (names, types, ranges)
before anything is scaled: `build_policy("threshold", bounds, {"up_after_s": 120})`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from llmbus.contract.config_file import StrictModel
from llmbus.contract.plugins import Registry
from llmbus_services.autoscaler.core.signals import PoolSignals


@dataclass(frozen=True)
class Bounds:
    min_replicas: int = 0
    max_replicas: int = 1

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class Decision:
    current_replicas: int
    desired_replicas: int
    reason: str
    signals: dict[str, float] = field(default_factory=dict)

    @property
    def action(self) -> Literal["up", "down", "hold"]:
        if self.desired_replicas > self.current_replicas:
            return "up"
        return "down" if self.desired_replicas < self.current_replicas else "hold"


class ScalingPolicy(Protocol):
    name: str

    def decide(self, signals: PoolSignals, current_replicas: int) -> Decision: ...


class PolicyParams(StrictModel):
    """A policy's parameters: an unknown name or a value of the wrong type or range is an error."""


# A policy class declares `Params` (a PolicyParams) and takes `bounds` and `params`.
POLICIES: Registry[ScalingPolicy] = Registry("scaling policy")


def build_policy(kind: str, bounds: Bounds, params: Mapping[str, Any] | None = None) -> ScalingPolicy:
    return POLICIES.build(kind, params, bounds=bounds)
