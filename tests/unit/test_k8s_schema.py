"""Every manifest under deploy/k8s validated offline against the Kubernetes API's own schema: the
official client's models (strict pydantic: unknown fields, wrong types and missing required
fields are errors), and KEDA's ScaledObject against a strict model of its v1alpha1 spec (its HPA
behavior is the API's autoscaling/v2 model). The Kustomization lists exactly the files there."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

models = pytest.importorskip("kubernetes.client.models")

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


class _Keda(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ScaleTargetRef(_Keda):
    api_version: str = Field(default="apps/v1", alias="apiVersion")
    kind: str = "Deployment"
    name: str
    env_source_container_name: str | None = Field(default=None, alias="envSourceContainerName")


class HpaConfig(_Keda):
    name: str | None = None
    behavior: dict[str, Any] | None = None


class Advanced(_Keda):
    restore_to_original_replica_count: bool | None = Field(default=None, alias="restoreToOriginalReplicaCount")
    horizontal_pod_autoscaler_config: HpaConfig | None = Field(default=None, alias="horizontalPodAutoscalerConfig")


class Trigger(_Keda):
    type: str
    name: str | None = None
    metadata: dict[str, str]  # KEDA takes trigger metadata as strings only
    metric_type: Literal["AverageValue", "Value", "Utilization"] | None = Field(default=None, alias="metricType")
    use_cached_metrics: bool | None = Field(default=None, alias="useCachedMetrics")
    authentication_ref: dict[str, str] | None = Field(default=None, alias="authenticationRef")


class ScaledObjectSpec(_Keda):
    scale_target_ref: ScaleTargetRef = Field(alias="scaleTargetRef")
    polling_interval: int | None = Field(default=None, alias="pollingInterval", ge=1)
    cooldown_period: int | None = Field(default=None, alias="cooldownPeriod", ge=0)
    idle_replica_count: int | None = Field(default=None, alias="idleReplicaCount", ge=0)
    min_replica_count: int | None = Field(default=None, alias="minReplicaCount", ge=0)
    max_replica_count: int | None = Field(default=None, alias="maxReplicaCount", ge=1)
    advanced: Advanced | None = None
    triggers: list[Trigger] = Field(min_length=1)


class ScaledObject(_Keda):
    api_version: Literal["keda.sh/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["ScaledObject"]
    metadata: dict[str, Any]
    spec: ScaledObjectSpec


def validate(doc: dict[str, Any]) -> None:
    """Raise ValidationError unless `doc` is a valid object of its apiVersion and kind."""
    if doc.get("apiVersion") == "keda.sh/v1alpha1":
        scaled = ScaledObject.model_validate(doc)
        models.V1ObjectMeta.model_validate(doc["metadata"])
        hpa = scaled.spec.advanced.horizontal_pod_autoscaler_config if scaled.spec.advanced else None
        if hpa is not None and hpa.behavior is not None:
            models.V2HorizontalPodAutoscalerBehavior.model_validate(hpa.behavior)
        return
    version = doc["apiVersion"].rsplit("/", 1)[-1]
    model = getattr(models, f"{version.capitalize()}{doc['kind']}", None)
    assert model is not None, f"no schema for {doc['apiVersion']} {doc['kind']}"
    model.model_validate(doc)


def manifests() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for file in sorted(K8S.rglob("*.yaml")):
        if file.name != "kustomization.yaml":
            found += [
                (f"{file.relative_to(K8S)}:{d['kind']}/{d['metadata']['name']}", d)
                for d in yaml.safe_load_all(file.read_text())
                if d
            ]
    return found


@pytest.mark.parametrize(("where", "doc"), manifests(), ids=[w for w, _ in manifests()])
def test_every_manifest_is_valid_against_the_api_schema(where: str, doc: dict[str, Any]) -> None:
    validate(doc)


def test_the_kustomization_lists_every_manifest_of_its_directory() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert set(kustomization) == {"apiVersion", "kind", "resources"}
    assert kustomization["kind"] == "Kustomization"
    listed = set(kustomization["resources"])
    assert listed == {f.name for f in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def _one(name: str) -> dict[str, Any]:
    return next(d for where, d in manifests() if where.startswith(name))


@pytest.mark.parametrize(
    ("name", "path", "bad"),
    [
        ("engine-worker-sim-llama-8b.yaml:StatefulSet", ("spec", "template", "spec", "containers", 0), {"imagee": "x"}),
        ("gateway.yaml:Service", ("spec", "ports", 0), {"port": "8000"}),  # a port is an integer
        ("gc.yaml:CronJob", ("spec",), {"schedule": None}),  # required
        ("keda/scaledobject-sim-llama-8b.yaml:ScaledObject", ("spec", "triggers", 0, "metadata"), {"threshold": 0.5}),
        ("keda/scaledobject-sim-llama-8b.yaml:ScaledObject", ("spec",), {"minReplicas": 2}),
        (
            "keda/scaledobject-sim-llama-8b.yaml:ScaledObject",
            ("spec", "advanced", "horizontalPodAutoscalerConfig", "behavior", "scaleDown"),
            {"stabilizationWindow": 300},
        ),
    ],
)
def test_the_check_refuses_a_broken_manifest(name: str, path: tuple[str | int, ...], bad: dict[str, Any]) -> None:
    doc = _one(name)
    node: Any = doc
    for step in path:
        node = node[step]
    node.update(bad)
    with pytest.raises(ValidationError):
        validate(doc)
