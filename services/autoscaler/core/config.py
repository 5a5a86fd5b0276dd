"""The autoscaler's pool file (YAML), validated by strict pydantic before anything is scaled.

    pools:
      sim-llama-8b:
        min_replicas: 0
        max_replicas: 4
        policy: {type: threshold, params: {target_queue_wait_ms: 300, up_after_s: 180}}
        local: {engine: sim, env: {LLMBUS_WORKER_SIM_MAX_NUM_SEQS: "16"}}
        kubernetes: {namespace: llmbus, statefulset: engine-worker-sim-llama-8b}

A bad file fails at start-up with pydantic's message; policy params are checked against the
policy's own fields there too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from llmbus.contract.config_file import StrictModel, load_yaml, shipped_or_path
from llmbus_services.autoscaler.core.base import POLICIES, Bounds, ScalingPolicy, build_policy

POLICIES_DIR = Path(__file__).resolve().parent.parent / "policies"


class PolicySpec(StrictModel):
    type: str
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> PolicySpec:
        if self.type not in POLICIES:
            raise ValueError(f"unknown policy {self.type!r}; known: {sorted(POLICIES)}")
        policy_class: Any = POLICIES[self.type]  # every registered policy is a dataclass
        fields = {f.name for f in dataclasses.fields(policy_class) if f.init} - {"bounds", "name"}
        if unknown := set(self.params) - fields:
            raise ValueError(f"policy {self.type!r} has no parameter(s) {sorted(unknown)}; known: {sorted(fields)}")
        return self


class LocalSpec(StrictModel):
    """Workers the local actuator starts for the pool (llmbus_services.engine_worker processes)."""

    engine: Literal["sim", "vllm"] = "sim"
    worker_prefix: str = Field(default="", pattern=r"^[A-Za-z0-9_.-]*$", description="'' → '<pool>-as'")
    stop_grace_s: float = Field(default=60.0, gt=0, description="SIGTERM, then SIGKILL after this")
    env: dict[str, str] = Field(default_factory=dict)


class KubernetesSpec(StrictModel):
    """The workload that runs the pool's workers: a StatefulSet (stable worker ids: a restarted pod
    reuses its dispatch topic) or a Deployment; exactly one."""

    namespace: str = "llmbus"
    deployment: str | None = None
    statefulset: str | None = None

    @model_validator(mode="after")
    def _one_workload(self) -> KubernetesSpec:
        if (self.deployment is None) == (self.statefulset is None):
            raise ValueError("kubernetes: name exactly one of deployment, statefulset")
        return self

    @property
    def kind(self) -> Literal["deployment", "stateful_set"]:
        """The client's name of the workload kind (read_namespaced_<kind>_scale)."""
        return "deployment" if self.deployment is not None else "stateful_set"

    @property
    def name(self) -> str:
        name = self.deployment or self.statefulset
        assert name is not None  # the validator above
        return name


class PoolSpec(StrictModel):
    min_replicas: int = Field(default=0, ge=0)
    max_replicas: int = Field(default=1, ge=1)
    policy: PolicySpec
    local: LocalSpec = Field(default_factory=LocalSpec)
    kubernetes: KubernetesSpec | None = None

    @model_validator(mode="after")
    def _bounds(self) -> PoolSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.min_replicas, self.max_replicas)

    def build_policy(self) -> ScalingPolicy:
        return build_policy(self.policy.type, self.bounds, self.policy.params)


class PoolsFile(StrictModel):
    pools: dict[str, PoolSpec]

    @classmethod
    def load(cls, name_or_path: str) -> PoolsFile:
        return load_yaml(shipped_or_path(name_or_path, POLICIES_DIR), cls)
