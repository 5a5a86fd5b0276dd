"""The scaling-policy interface, its decision and the registry YAML names policies by.

A policy is fed one pool's `PoolSignals` in time order (the clock is `signals.now_ms`, so
tests and the benchmark drive it in virtual time) and answers how many replicas the pool
should have. It keeps its own timers (sustained-high, idle, cooldown, forecast history).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

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


PolicyFactory = Callable[..., ScalingPolicy]
POLICIES: dict[str, PolicyFactory] = {}


def register(name: str) -> Callable[[Any], Any]:
    def deco(factory: Any) -> Any:
        POLICIES[name] = factory
        return factory

    return deco


def build_policy(kind: str, bounds: Bounds, params: dict[str, Any]) -> ScalingPolicy:
    if kind not in POLICIES:
        raise ValueError(f"unknown scaling policy {kind!r}; known: {sorted(POLICIES)}")
    return POLICIES[kind](bounds=bounds, **params)
