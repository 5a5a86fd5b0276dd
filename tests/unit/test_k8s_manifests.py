"""deploy/k8s checked offline: every service has a Deployment that runs a real module with settings
it reads, selectors match, the workers drain before SIGKILL, and each KEDA ScaledObject scales an
existing Deployment on the metric the scheduler exports (min 2, max 20, p99 > 0.5 s, 300 s)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from llmbus.settings import BusSettings
from services.autoscaler.config import AutoscalerSettings
from services.autoscaler.policy.config import PoolsFile
from services.engine_worker.config import WorkerSettings
from services.gateway.config import GatewaySettings
from services.router.config import RouterSettings
from services.scheduler.config import SchedulerSettings
from services.scheduler.pool_stats import QUEUE_WAIT_SECONDS

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
PREFIXES = {
    "LLMBUS_WORKER_": WorkerSettings,
    "LLMBUS_ROUTER_": RouterSettings,
    "LLMBUS_SCHEDULER_": SchedulerSettings,
    "LLMBUS_AUTOSCALER_": AutoscalerSettings,
    "LLMBUS_GATEWAY_": GatewaySettings,
    "LLMBUS_": BusSettings,
}


def documents(path: Path) -> list[dict]:
    docs = []
    for file in sorted(path.glob("*.yaml")):
        if file.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(file.read_text()) if d]
    return docs


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def check_env(name: str, variables: list[str]) -> None:
    for var in variables:
        prefix = next(p for p in PREFIXES if var.startswith(p))
        assert var.removeprefix(prefix).lower() in PREFIXES[prefix].model_fields, f"{name}: {var} is read by nobody"


def test_every_service_has_a_deployment_running_a_real_module() -> None:
    docs = documents(K8S)
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc)
        if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == "llmbus", doc["metadata"]["name"]
    deployments = by_kind(docs, "Deployment")
    modules = set()
    config = by_kind(docs, "ConfigMap")["llmbus-env"]["data"]
    check_env("llmbus-env", list(config))
    for name, dep in deployments.items():
        spec = dep["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items(), name
        (container,) = spec["template"]["spec"]["containers"]
        command = container["command"]
        assert command[:2] == ["python", "-m"] and importlib.util.find_spec(command[2]) is not None, name
        modules.add(command[2])
        check_env(name, [e["name"] for e in container.get("env", [])])
        service = by_kind(docs, "Service")[name]
        assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    services = {p.name for p in (REPO / "services").iterdir() if (p / "__main__.py").exists()}
    assert {m.removeprefix("services.") for m in modules} == services


def test_workers_drain_before_sigkill_and_autoscaler_may_scale_them() -> None:
    docs = documents(K8S)
    for name, dep in by_kind(docs, "Deployment").items():
        if not name.startswith("engine-worker-"):
            continue
        pod = dep["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert float(env["LLMBUS_WORKER_DRAIN_GRACE_S"]) + 10 <= pod["terminationGracePeriodSeconds"]
    autoscaler = by_kind(docs, "Deployment")["autoscaler"]["spec"]["template"]["spec"]
    role = by_kind(docs, "Role")[autoscaler["serviceAccountName"]]
    assert any("deployments/scale" in r["resources"] and "patch" in r["verbs"] for r in role["rules"])
    # every pool of the shipped pool file points at a Deployment that exists
    pools = PoolsFile.load("default").pools
    for pool, spec in pools.items():
        assert spec.kubernetes is not None and spec.kubernetes.deployment in by_kind(docs, "Deployment"), pool


def test_keda_scaled_objects_scale_on_the_schedulers_queue_wait() -> None:
    deployments = by_kind(documents(K8S), "Deployment")
    scaled = by_kind(documents(K8S / "keda"), "ScaledObject")
    assert scaled
    metric = QUEUE_WAIT_SECONDS._name + "_bucket"  # the histogram the scheduler exports
    for name, obj in scaled.items():
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        spec = obj["spec"]
        assert spec["scaleTargetRef"]["name"] in deployments, name
        assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["cooldownPeriod"]) == (2, 20, 300)
        assert (
            spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
            == 300
        )
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "prometheus"
        query = trigger["metadata"]["query"]
        assert "histogram_quantile(0.99" in query and metric in query
        pool = obj["metadata"]["labels"]["llmbus.io/pool"]
        assert re.search(r'model_name="([^"]+)"', query).group(1) == pool  # type: ignore[union-attr]
        assert float(trigger["metadata"]["threshold"]) == 0.5


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_renders_the_services() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], check=True, timeout=60, capture_output=True, text=True
    ).stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(out) if d]
    assert kinds.count("Deployment") == len(by_kind(documents(K8S), "Deployment"))


def test_every_pod_connects_secured_as_its_own_principal_from_its_own_secret() -> None:
    docs = documents(K8S)
    config = by_kind(docs, "ConfigMap")["llmbus-env"]["data"]
    assert (config["LLMBUS_KAFKA_SECURITY_PROTOCOL"], config["LLMBUS_KAFKA_SASL_MECHANISM"]) == (
        "SASL_PLAINTEXT",
        "SCRAM-SHA-512",
    )
    modules_principal = {
        "services.router": "router",
        "services.scheduler": "scheduler",
        "services.engine_worker": "engine-worker",
        "services.cost_accounting": "cost-accounting",
        "services.shadow_comparator": "shadow-comparator",
        "services.gateway": "gateway",
        "services.autoscaler": "autoscaler",
    }
    pods = [(n, d["spec"]["template"]["spec"]) for n, d in by_kind(docs, "Deployment").items()]
    pods += [(n, d["spec"]["template"]["spec"]) for n, d in by_kind(docs, "Job").items()]
    for name, pod in pods:
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        command = container["command"]
        principal = modules_principal[command[2]] if command[:2] == ["python", "-m"] else "admin"
        assert env["LLMBUS_KAFKA_SASL_USERNAME"]["value"] == principal, name
        secret = env["LLMBUS_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert secret == {"name": f"llmbus-kafka-{principal}", "key": "password"}, name
        assert env["LLMBUS_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "llmbus-redis", "key": "password"}
