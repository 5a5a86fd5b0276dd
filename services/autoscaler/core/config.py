"""The autoscaler's pool file (YAML), validated by strict pydantic before anything is scaled.

    pools:
      sim-llama-8b:
        min_replicas: 0
        max_replicas: 4
        policy: {type: threshold, params: {target_queue_wait_ms: 300, up_after_s: 180}}
        local: {engine: sim, env: {LLMBUS_WORKER_SIM_MAX_NUM_SEQS: "16"}}
        kubernetes: {namespace: llmbus, statefulset: engine-worker-sim-llama-8b}

A bad file fails at start-up with pydantic's message; policy params are checked by the
policy's own strict model (core/base.py: names, types, ranges) there too.
"""

from __future__ import annotations

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
        POLICIES.check(self.type, self.params, "bounds")  # an unknown policy or param, a bad value: an error
        return self


class LocalSpec(StrictModel):
    """Workers the local actuator starts for the pool (llmbus_services.engine_worker processes)."""

    engine: Literal["sim", "vllm"] = "sim"
    worker_prefix: str = Field(default="", pattern=r"^[A-Za-z0-9_.-]*$", description="'' → '<pool>-as'")
    stop_grace_s: float = Field(default=60.0, gt=0, description="SIGTERM, then SIGKILL after this")
    # Scale-down: a worker hands its answers that can be continued over mid-stream this long after SIGTERM
    # (they go on elsewhere); the rest get stop_grace_s less 5 s to finish (LLMBUS_WORKER_DRAIN_GRACE_S).
    handover_grace_s: float = Field(default=2.0, ge=0)
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _hands_over_before_the_kill(self) -> LocalSpec:
        if self.handover_grace_s >= self.drain_grace_s:
            raise ValueError(
                f"handover_grace_s {self.handover_grace_s} must be below the drain grace {self.drain_grace_s} "
                f"(stop_grace_s {self.stop_grace_s} less 5 s)"
            )
        return self

    @property
    def drain_grace_s(self) -> float:
        """How long a stopped worker lets what it cannot hand over finish, before its SIGKILL."""
        return max(1.0, self.stop_grace_s - 5)


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
