"""deploy/k8s checked offline: every service has a workload (Deployment, StatefulSet or DaemonSet) that runs a
real module with settings it reads, selectors match, the workers drain before SIGKILL, workers and
gateways have stable ids (StatefulSet pod names), the gc CronJob runs, and each KEDA ScaledObject
scales an existing workload on the metric the scheduler exports (min 2, max 20, p99 > 0.5 s, 300 s)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from llmbus.artifacts import CacheSettings
from llmbus.cli.gc import parse_duration_ms
from llmbus.security import redis_acls
from llmbus.settings import BusSettings, ObjectStoreSettings
from llmbus_services.archive.config import ArchiveSettings
from llmbus_services.autoscaler.config import AutoscalerSettings
from llmbus_services.autoscaler.core.config import PoolsFile
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.gateway.config import GatewaySettings
from llmbus_services.node_agent.config import NodeAgentSettings
from llmbus_services.router.config import RouterSettings
from llmbus_services.scheduler.adapters.pool_stats import QUEUE_WAIT_SECONDS, TTFT_SECONDS
from llmbus_services.scheduler.config import SchedulerSettings

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
PREFIXES = {
    "LLMBUS_WORKER_": WorkerSettings,
    "LLMBUS_ROUTER_": RouterSettings,
    "LLMBUS_SCHEDULER_": SchedulerSettings,
    "LLMBUS_AUTOSCALER_": AutoscalerSettings,
    "LLMBUS_GATEWAY_": GatewaySettings,
    "LLMBUS_ARCHIVE_": ArchiveSettings,
    "LLMBUS_NODE_AGENT_": NodeAgentSettings,
    "NVIDIA_": None,  # the NVIDIA container runtime's (which GPUs and driver parts it mounts)
    "LLMBUS_S3_": ObjectStoreSettings,
    "LLMBUS_ARTIFACT_CACHE_": CacheSettings,
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


def workloads(docs: list[dict]) -> dict[str, dict]:
    """Deployments, StatefulSets and DaemonSets by name (a pod template under spec.template each way)."""
    return by_kind(docs, "Deployment") | by_kind(docs, "StatefulSet") | by_kind(docs, "DaemonSet")


def check_env(name: str, variables: list[str]) -> None:
    for var in variables:
        prefix = next(p for p in PREFIXES if var.startswith(p))
        settings = PREFIXES[prefix]
        assert settings is None or var.removeprefix(prefix).lower() in settings.model_fields, (
            f"{name}: {var} is read by nobody"
        )


def test_every_service_has_a_deployment_running_a_real_module() -> None:
    docs = documents(K8S)
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc)
        if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == "llmbus", doc["metadata"]["name"]
    deployments = workloads(docs)
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
    assert {m.removeprefix("llmbus_services.") for m in modules} == services


def test_workers_drain_before_sigkill_and_autoscaler_may_scale_them() -> None:
    docs = documents(K8S)
    for name, dep in workloads(docs).items():
        if not name.startswith("engine-worker-"):
            continue
        pod = dep["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        handover, drain = float(env["LLMBUS_WORKER_HANDOVER_GRACE_S"]), float(env["LLMBUS_WORKER_DRAIN_GRACE_S"])
        # answers handed over mid-stream first, the rest finished, all of it before the kubelet's SIGKILL
        assert handover < drain and drain + 10 <= pod["terminationGracePeriodSeconds"]
    autoscaler = by_kind(docs, "Deployment")["autoscaler"]["spec"]["template"]["spec"]
    role = by_kind(docs, "Role")[autoscaler["serviceAccountName"]]
    # every pool of the shipped pool file points at a workload that exists, which the role may scale
    pools = PoolsFile.load("default").pools
    for pool, spec in pools.items():
        assert spec.kubernetes is not None, pool
        kind = "StatefulSet" if spec.kubernetes.statefulset else "Deployment"
        assert spec.kubernetes.name in by_kind(docs, kind), pool
        scale = kind.lower() + "s/scale"
        assert any(scale in r["resources"] and "patch" in r["verbs"] for r in role["rules"]), pool


def test_workers_and_gateways_have_stable_ids_from_statefulset_pod_names() -> None:
    docs = documents(K8S)
    sets = by_kind(docs, "StatefulSet")
    workers = [n for n in workloads(docs) if n.startswith("engine-worker-")]
    assert workers and set(workers) <= set(sets)
    assert "gateway" in sets
    for name, sts in sets.items():
        governing = by_kind(docs, "Service")[sts["spec"]["serviceName"]]
        assert governing["spec"]["clusterIP"] == "None", name  # headless: stable pod names
        assert governing["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items(), name
        env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
        if name in workers:  # worker id = pod name = <set>-<ordinal>
            assert env["LLMBUS_WORKER_WORKER_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        else:  # the gateway's id is gw-<hostname>, and a StatefulSet pod's hostname is its pod name
            assert "LLMBUS_GATEWAY_INSTANCE_ID" not in env
    assert GatewaySettings.model_fields["instance_id"].default_factory is not None


def test_the_gc_cronjob_runs_llmbus_gc_as_admin() -> None:
    docs = documents(K8S)
    job = by_kind(docs, "CronJob")["llmbus-gc"]
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    (container,) = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["llmbus", "gc"] and "--dry-run" not in command
    assert parse_duration_ms(command[command.index("--older-than") + 1]) >= 24 * 3_600_000
    check_env("llmbus-gc", [e["name"] for e in container["env"]])
    assert "gc.yaml" in yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]


def test_keda_scaled_objects_scale_on_the_schedulers_ttft_and_queue_wait() -> None:
    """Each pool's ScaledObject has the threshold policy's two triggers on the scheduler's histograms:
    p99 TTFT above the tier's target (2 s) and p99 queue wait above 0.5 s, held for the scale-up window."""
    docs = documents(K8S)
    scaled = by_kind(documents(K8S / "keda"), "ScaledObject")
    assert scaled
    wanted = {
        "ttft-p99": (TTFT_SECONDS._name + "_bucket", 2.0),
        "queue-wait-p99": (QUEUE_WAIT_SECONDS._name + "_bucket", 0.5),
    }
    for name, obj in scaled.items():
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        spec = obj["spec"]
        target = spec["scaleTargetRef"]
        assert target["name"] in by_kind(docs, target["kind"]), name
        assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["cooldownPeriod"]) == (2, 20, 300)
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 180  # "for 3 minutes"
        triggers = {t["name"]: t for t in spec["triggers"]}
        assert set(triggers) == set(wanted), name
        pool = obj["metadata"]["labels"]["llmbus.io/pool"]
        for trigger_name, (metric, threshold) in wanted.items():
            trigger = triggers[trigger_name]
            assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
            query = trigger["metadata"]["query"]
            assert "histogram_quantile(0.99" in query and metric in query
            assert re.search(r'model_name="([^"]+)"', query).group(1) == pool  # type: ignore[union-attr]
            assert float(trigger["metadata"]["threshold"]) == threshold


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_renders_the_services() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], check=True, timeout=60, capture_output=True, text=True
    ).stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(out) if d]
    assert kinds.count("Deployment") == len(by_kind(documents(K8S), "Deployment"))
    assert kinds.count("StatefulSet") == len(by_kind(documents(K8S), "StatefulSet"))


def test_every_pod_connects_secured_as_its_own_principal_from_its_own_secret() -> None:
    docs = documents(K8S)
    config = by_kind(docs, "ConfigMap")["llmbus-env"]["data"]
    assert (config["LLMBUS_KAFKA_SECURITY_PROTOCOL"], config["LLMBUS_KAFKA_SASL_MECHANISM"]) == (
        "SASL_PLAINTEXT",
        "SCRAM-SHA-512",
    )
    modules_principal = {
        "llmbus_services.router": "router",
        "llmbus_services.scheduler": "scheduler",
        "llmbus_services.engine_worker": "engine-worker",
        "llmbus_services.cost_accounting": "cost-accounting",
        "llmbus_services.shadow_comparator": "shadow-comparator",
        "llmbus_services.gateway": "gateway",
        "llmbus_services.autoscaler": "autoscaler",
        "llmbus_services.archive": "archive",
        "llmbus_services.node_agent": "node-agent",
    }
    pods = [(n, d["spec"]["template"]["spec"]) for n, d in workloads(docs).items()]
    pods += [(n, d["spec"]["template"]["spec"]) for n, d in by_kind(docs, "Job").items()]
    pods += [(n, d["spec"]["jobTemplate"]["spec"]["template"]["spec"]) for n, d in by_kind(docs, "CronJob").items()]
    for name, pod in pods:
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        command = container["command"]
        principal = modules_principal[command[2]] if command[:2] == ["python", "-m"] else "admin"
        assert env["LLMBUS_KAFKA_SASL_USERNAME"]["value"] == principal, name
        secret = env["LLMBUS_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert secret == {"name": f"llmbus-kafka-{principal}", "key": "password"}, name
        redis_secret = env.get("LLMBUS_REDIS_PASSWORD", {}).get("valueFrom", {}).get("secretKeyRef")
        if principal == "admin":  # operators' jobs: Redis's own `default` user where they need Redis (gc)
            assert redis_secret in (None, {"name": "llmbus-redis", "key": "password"}), name
            assert "LLMBUS_REDIS_USERNAME" not in env, name
            continue
        if principal not in redis_acls.users_with_redis():
            assert redis_secret is None and "LLMBUS_REDIS_USERNAME" not in env, name  # no Redis at all
            continue
        # its own ACL user (llmbus.security.redis_acls), never the full-rights `default` password
        assert env["LLMBUS_REDIS_USERNAME"]["value"] == principal, name
        assert redis_secret == {"name": f"llmbus-redis-{principal}", "key": "password"}, name


def test_the_gateway_has_liveness_and_readiness_probes_on_its_real_routes() -> None:
    """Readiness on GET /ready (503 while the reply tail is down or the catalog unread), liveness on GET
    /health, both on the container's http port, and both routes the gateway's app really serves."""
    from types import SimpleNamespace

    from llmbus_services.gateway.flows import create_app

    pod = workloads(documents(K8S))["gateway"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"] for p in container["ports"]}
    served = {getattr(r, "path", None) for r in create_app(SimpleNamespace()).routes}  # type: ignore[arg-type]
    for probe, path in (("readinessProbe", "/ready"), ("livenessProbe", "/health")):
        assert probe in container, f"the gateway has no {probe}"
        get = container[probe]["httpGet"]
        assert get["path"] == path and get["path"] in served and get["port"] in ports


def test_the_node_agent_runs_on_every_node_under_the_node_id_its_workers_use() -> None:
    docs = documents(K8S)
    agent = by_kind(docs, "DaemonSet")["node-agent"]["spec"]["template"]["spec"]
    env = {e["name"]: e for e in agent["containers"][0]["env"]}
    node_name = {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["LLMBUS_NODE_AGENT_NODE_ID"]["valueFrom"] == node_name
    for name, workload in workloads(docs).items():
        if name.startswith("engine-worker-"):
            worker_env = {e["name"]: e for e in workload["spec"]["template"]["spec"]["containers"][0]["env"]}
            assert worker_env["LLMBUS_WORKER_NODE_ID"]["valueFrom"] == node_name, name
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in agent["tolerations"]
    assert "nvidia.com/gpu" not in str(agent["containers"][0].get("resources", {}))  # it claims no GPU
