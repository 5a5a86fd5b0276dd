"""The compose stack as an operator would start it: each check reads the rendered configuration
(docker-compose.yml, the scripts its containers run, prometheus.yml) for a defect that kept it from
coming up or from being right; `make compose-smoke` runs the real thing on a Docker engine."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from llmbus.security import acls, redis_acls
from llmbus_services.router.core.config import load_policy

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "deploy" / "compose"
SPEC = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = SPEC["services"]
# The stack's services (`up` starts them); worker-version is run by hand, once per model version (profile tools).
LONG_RUNNING = {
    n: s
    for n, s in SERVICES.items()
    if s.get("command", [None])[:2] == ["python", "-m"] and "tools" not in s.get("profiles", [])
}
PREFIX = "2"  # the file's default LLMBUS_PORT_PREFIX


def render(value: str) -> str:
    """Compose's interpolation of ${VAR:-default} with every variable unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def env_of(name: str) -> dict[str, str]:
    return {key: render(str(value)) for key, value in SERVICES[name].get("environment", {}).items()}


def kafka_properties(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "admin").write_text("admin-pw")
    env = os.environ | {
        "SECRETS_DIR": str(tmp_path),
        "KAFKA_PROPERTIES": str(tmp_path / "server.properties"),
        "KAFKA_PORT": "29092",
        "KAFKA_CONTROLLER_PORT": "29093",
    }
    script = COMPOSE_DIR / "security" / "kafka-run.sh"
    out = subprocess.run(["sh", str(script), "config"], env=env, capture_output=True, text=True, timeout=10, check=True)
    lines = [line for line in out.stdout.splitlines() if "=" in line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_every_sasl_mechanism_of_every_kafka_listener_has_its_jaas_entry(tmp_path: Path) -> None:
    # The broker refuses to start when a listener enables SCRAM or PLAIN without a JAAS login for it.
    props = kafka_properties(tmp_path)
    protocols = dict(pair.split(":") for pair in props["listener.security.protocol.map"].split(","))
    listeners = [entry.split("://")[0] for entry in props["listeners"].split(",")]
    for listener in listeners:
        assert protocols[listener].startswith("SASL_"), f"{listener} is not authenticated"
        name = listener.lower()
        enabled = props.get(f"listener.name.{name}.sasl.enabled.mechanisms", props["sasl.enabled.mechanisms"])
        for mechanism in enabled.split(","):
            jaas = props.get(f"listener.name.{name}.{mechanism.lower()}.sasl.jaas.config", "")
            module = "ScramLoginModule" if mechanism.startswith("SCRAM") else "PlainLoginModule"
            assert module in jaas, f"{listener}: {mechanism} enabled without a JAAS entry"
            if mechanism == "PLAIN":
                assert 'user_admin="admin-pw"' in jaas, f"{listener}: PLAIN knows no user"
    assert props["sasl.mechanism.inter.broker.protocol"] in props["sasl.enabled.mechanisms"].split(",")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert all("127.0.0.1:" in entry for entry in props["listeners"].split(","))  # loopback only


def test_kafka_is_formatted_with_a_scram_user_for_every_principal_and_serves_reading_only_admin() -> None:
    principals = set(acls.principals(["acme", "globex"]))
    assert set(SERVICES["kafka-format"]["secrets"]) == principals
    assert SERVICES["kafka"]["secrets"] == ["admin"]
    assert set(SPEC["secrets"]) == principals | {"redis", "redis-users", "objectstore"}


def test_each_container_reads_only_its_own_credentials() -> None:
    extra = {
        "autoscaler": {"engine-worker"},  # it starts engine-workers, which connect as engine-worker
        # the object store's secret key where the store is used: the archive's bucket, pushing models, fetching them
        "archive": {"objectstore"},
        "cli": {"objectstore"},
        "worker-vllm-1": {"objectstore"},
        "worker-version": {"objectstore"},
    }
    for name, service in SERVICES.items():
        for mount in service.get("volumes", []):
            whole_store = "SECRETS_DIR" in mount or (mount.split(":")[0] in SPEC["volumes"] and "secret" in mount)
            assert not whole_store or name == "secrets-init", f"{name} mounts every credential: {mount}"
        if "LLMBUS_KAFKA_SASL_USERNAME" not in service.get("environment", {}):
            continue
        principal = service["environment"]["LLMBUS_KAFKA_SASL_USERNAME"]
        assert set(service["secrets"]) == {principal} | extra.get(name, set()), name
    assert SERVICES["redis"]["secrets"] == ["redis", "redis-users"]
    assert SERVICES["objectstore"]["secrets"] == ["objectstore"]  # its secret key; no Redis user


def test_each_container_logs_in_to_redis_as_its_own_acl_user_and_the_archive_not_at_all() -> None:
    """One Redis user per service (its principal's name and password; llmbus.security.redis_acls), from the
    ACL file secrets-init generates; nobody but Redis itself holds the `default` user's password."""
    with_redis = redis_acls.users_with_redis()
    for name, service in SERVICES.items():
        env = service.get("environment", {})
        user = env.get("LLMBUS_REDIS_USERNAME")
        if user is None:
            assert "redis" not in service.get("secrets", []) or name == "redis", name
            continue
        assert user == env["LLMBUS_KAFKA_SASL_USERNAME"] and user in with_redis, name
        assert "redis" not in service["secrets"], f"{name} holds Redis's full-rights password"
    assert "LLMBUS_REDIS_USERNAME" not in SERVICES["archive"]["environment"]
    assert "LLMBUS_REDIS_USERNAME" not in SERVICES["autoscaler"]["environment"]
    init = " ".join(SERVICES["secrets-init"]["command"])
    assert "llmbus acl redis-users /secrets -o /secrets/redis-users.acl" in init
    run_script = (COMPOSE_DIR / "security" / "redis-run.sh").read_text()
    assert "--aclfile /run/secrets/redis-users" in run_script and "requirepass" not in run_script
    entry = (COMPOSE_DIR / "security" / "with-secrets.sh").read_text()
    assert "/run/secrets/${LLMBUS_REDIS_USERNAME}" in entry and "/run/secrets/redis)" not in entry


def test_redis_keeps_its_data_aof_everysec_on_a_volume() -> None:
    redis = SERVICES["redis"]
    assert any(mount.split(":")[1] == "/data" and mount.split(":")[0] in SPEC["volumes"] for mount in redis["volumes"])
    run_script = (COMPOSE_DIR / "security" / "redis-run.sh").read_text()
    assert "--appendonly yes" in run_script and "--appendfsync everysec" in run_script and "--dir /data" in run_script
    assert "--appendonly no" not in run_script


def test_no_bridge_no_published_port_everything_on_loopback() -> None:
    for name, service in SERVICES.items():
        assert service.get("network_mode") in ("host", "none"), name
        assert "ports" not in service and "networks" not in service, name
    for name in LONG_RUNNING:
        env = env_of(name)
        assert env["LLMBUS_METRICS_HOST" if "LLMBUS_METRICS_PORT" in env else "LLMBUS_GATEWAY_HOST"] == "127.0.0.1"
        assert env["LLMBUS_KAFKA_BOOTSTRAP"] == "127.0.0.1:29092" and env["LLMBUS_REDIS_URL"].startswith(
            "redis://127.0.0.1:26379"
        )


def test_ports_are_distinct_and_apart_from_the_dev_broker_and_redis() -> None:
    ports = [
        env_of(n).get("LLMBUS_METRICS_PORT") or env_of(n)["LLMBUS_GATEWAY_PORT"]
        for n in LONG_RUNNING
        if n != "worker-vllm-1"
    ]
    ports += [env_of("kafka")["KAFKA_PORT"], env_of("kafka")["KAFKA_CONTROLLER_PORT"], env_of("redis")["REDIS_PORT"]]
    assert len(set(ports)) == len(ports)
    assert not {"9092", "9093", "6379", "8000"} & set(ports)


def test_prometheus_scrapes_every_service_and_loads_alert_rules() -> None:
    prometheus = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text().replace("@P@", PREFIX))
    targets = {
        target
        for job in prometheus["scrape_configs"]
        for config in job["static_configs"]
        for target in config["targets"]
    }
    for name in LONG_RUNNING:
        env = env_of(name)
        port = env.get("LLMBUS_METRICS_PORT") or env["LLMBUS_GATEWAY_PORT"]
        assert f"127.0.0.1:{port}" in targets, f"{name}'s /metrics ({port}) is not scraped"
    # The workers the autoscaler starts serve /metrics on base + n: scraped too.
    base = int(env_of("autoscaler")["LLMBUS_AUTOSCALER_WORKER_METRICS_PORT_BASE"])
    assert {f"127.0.0.1:{base + n}" for n in (1, 2, 3, 4)} <= targets
    assert prometheus["rule_files"] == ["/etc/prometheus/alerts.yml"]
    mounts = SERVICES["prometheus"]["volumes"]
    assert any(m.startswith("../prometheus/alerts.yml:/etc/prometheus/alerts.yml") for m in mounts)


def test_alert_rules_cover_queue_wait_ttft_errors_budget_lag_and_down_on_metrics_that_exist() -> None:
    rules = yaml.safe_load((REPO / "deploy/prometheus/alerts.yml").read_text())
    exprs = {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}
    defined = "\n".join(
        p.read_text() for p in [*REPO.glob("libs/common/llmbus/**/*.py"), *REPO.glob("services/**/*.py")]
    )
    wanted = {
        "llmbus_scheduler_queue_wait_seconds": "queue wait",
        "llmbus_scheduler_time_to_first_token_seconds": "TTFT",
        "llmbus_request_results_total": "error rate",
        "llmbus_cost_budget_alerts_total": "budget",
        "llmbus_consumer_lag_records": "consumer lag",
        "llmbus_worker_ready": "worker down",
    }
    for metric, what in wanted.items():
        assert f'"{metric}"' in defined, f"{metric} is no metric of the code"
        assert any(metric in expr for expr in exprs.values()), f"no alert on {what}"
    assert any('up{job="llmbus"} == 0' in expr for expr in exprs.values())


def test_a_sim_worker_serves_every_model_of_the_default_policy() -> None:
    policy = load_policy(REPO / "services/router/policies/default.yaml")
    served = {env_of(n)["LLMBUS_WORKER_MODEL"] for n in LONG_RUNNING if "LLMBUS_WORKER_MODEL" in env_of(n)}
    assert set(policy.models) <= served
    worker_ids = [env_of(n)["LLMBUS_WORKER_WORKER_ID"] for n in LONG_RUNNING if n.startswith("worker-")]
    assert len(set(worker_ids)) == len(worker_ids)


def test_each_tier_worker_has_its_models_window_and_the_dev_stacks_profile() -> None:
    """What the router admits to a model, its compose worker takes (as in `make up`): the README's compose
    example without max_tokens is not refused for a window the worker never said it had."""
    from llmbus.cli.stack import TIER_FLEET

    policy = load_policy(REPO / "services/router/policies/default.yaml")
    by_model = {env_of(n)["LLMBUS_WORKER_MODEL"]: env_of(n) for n in LONG_RUNNING if n.startswith("worker-")}
    for tier in TIER_FLEET:
        env = by_model[tier.model]
        assert int(env["LLMBUS_WORKER_SIM_MAX_MODEL_LEN"]) == policy.models[tier.model].max_model_len
        assert env["LLMBUS_WORKER_SIM_PROFILE"] == tier.sim_profile


def test_the_autoscaler_can_start_workers_in_its_image() -> None:
    env = env_of("autoscaler")
    assert int(env["LLMBUS_AUTOSCALER_WORKER_METRICS_PORT_BASE"]) > 0
    dockerfile = (COMPOSE_DIR / "Dockerfile").read_text()
    # uid 1000 with a home and a writable run directory (the local actuator's pid and log files).
    assert "useradd --uid 1000 --create-home" in dockerfile
    assert "install -d -o 1000 -g 1000 /var/lib/llmbus" in dockerfile and "LLMBUS_CACHE=/var/lib/llmbus" in dockerfile


def test_the_image_has_the_kubernetes_client_the_k8s_autoscaler_imports() -> None:
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    dockerfile = (COMPOSE_DIR / "Dockerfile").read_text()
    install = next(line for line in dockerfile.splitlines() if "pip install -q -r requirements/runtime.txt" in line)
    assert all(f'"{requirement}"' in install for requirement in extras["kubernetes"])


def test_spans_go_to_the_stacks_collector_which_prometheus_scrapes() -> None:
    collector = yaml.safe_load(
        (REPO / "deploy/otel/collector.yaml").read_text().replace("${env:LLMBUS_PORT_PREFIX}", PREFIX)
    )
    http_endpoint = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert "profiles" not in SERVICES["otel-collector"] and http_endpoint == "127.0.0.1:24318"
    for name in LONG_RUNNING:
        assert env_of(name)["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://{http_endpoint}", name
    prometheus = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text().replace("@P@", PREFIX))
    targets = {t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    assert collector["service"]["telemetry"]["metrics"]["address"] in targets
