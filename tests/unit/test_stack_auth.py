"""The secured local stack gives each process its own principal, workers the autoscaler starts included."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from llmbus.cli import stack_auth
from llmbus.settings import BusSettings


def test_each_module_connects_as_its_principal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kafka.credentials").write_text("engine-worker=w-pw\nrouter=r-pw\noperator=o-pw\n")
    monkeypatch.delenv("KAFKA_CREDENTIALS", raising=False)
    monkeypatch.delenv("KAFKA_NAME", raising=False)
    monkeypatch.delenv("LLMBUS_STACK_AUTH", raising=False)
    assert stack_auth.service_env(tmp_path, "llmbus_services.router") == {}  # dev mode: nothing changes
    monkeypatch.setenv("LLMBUS_STACK_AUTH", "1")
    worker = stack_auth.service_env(tmp_path, "llmbus_services.engine_worker")
    assert worker["LLMBUS_KAFKA_SASL_USERNAME"] == "engine-worker" and worker["LLMBUS_KAFKA_SASL_PASSWORD"] == "w-pw"
    assert stack_auth.service_env(tmp_path, "llmbus_services.router")["LLMBUS_KAFKA_SASL_USERNAME"] == "router"


def test_compose_secrets_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "engine-worker").write_text("w-pw\n")
    monkeypatch.setenv("KAFKA_CREDENTIALS", str(tmp_path))
    monkeypatch.setenv("LLMBUS_STACK_AUTH", "1")
    assert stack_auth.service_env(tmp_path, "llmbus_services.engine_worker")["LLMBUS_KAFKA_SASL_PASSWORD"] == "w-pw"


def test_autoscaler_workers_connect_as_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The autoscaler gets the worker principal's credentials for the workers it starts, not its own."""
    from llmbus_services.autoscaler.adapters.actuators import build_actuator
    from llmbus_services.autoscaler.config import AutoscalerSettings
    from llmbus_services.autoscaler.core.config import PoolsFile

    (tmp_path / "kafka.credentials").write_text("engine-worker=w-pw\nautoscaler=a-pw\n")
    monkeypatch.delenv("KAFKA_CREDENTIALS", raising=False)
    monkeypatch.delenv("KAFKA_NAME", raising=False)
    monkeypatch.setenv("LLMBUS_STACK_AUTH", "1")
    env = stack_auth.service_env(tmp_path, "llmbus_services.autoscaler")
    assert env["LLMBUS_KAFKA_SASL_USERNAME"] == "autoscaler"
    for name, value in env.items():  # what the autoscaler process is started with
        monkeypatch.setenv(name, value)
    actuator = build_actuator(AutoscalerSettings(), PoolsFile.load("default"), BusSettings())
    pool = next(iter(PoolsFile.load("default").pools))
    worker = actuator.process(pool, 1).env  # type: ignore[attr-defined]
    assert worker["LLMBUS_KAFKA_SASL_USERNAME"] == "engine-worker" and worker["LLMBUS_KAFKA_SASL_PASSWORD"] == "w-pw"


def test_each_service_with_redis_state_logs_in_to_redis_as_itself_and_the_archive_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make up AUTH=1`: Redis is started with one ACL user per service (same name and password as the
    service's Kafka principal); the archive and the autoscaler get no Redis identity, the workers the
    autoscaler starts get the workers'."""
    principals = ["admin", "router", "engine-worker", "autoscaler", "archive", "gateway", "operator"]
    (tmp_path / "kafka.credentials").write_text("".join(f"{p}={p}-pw\n" for p in principals))
    monkeypatch.delenv("KAFKA_CREDENTIALS", raising=False)
    monkeypatch.delenv("KAFKA_NAME", raising=False)
    monkeypatch.setenv("LLMBUS_REDIS_PASSWORD", "before")  # redis_env sets it in this process: restored after
    monkeypatch.delenv("LLMBUS_STACK_AUTH", raising=False)
    assert stack_auth.redis_env(tmp_path) == {}  # dev mode: the shared Redis as it is
    monkeypatch.setenv("LLMBUS_STACK_AUTH", "1")
    router = stack_auth.service_env(tmp_path, "llmbus_services.router")
    assert (router["LLMBUS_REDIS_USERNAME"], router["LLMBUS_REDIS_PASSWORD"]) == ("router", "router-pw")
    for module in ("llmbus_services.archive", "llmbus_services.autoscaler"):
        env = stack_auth.service_env(tmp_path, module)
        assert "LLMBUS_REDIS_USERNAME" not in env and "LLMBUS_REDIS_PASSWORD" not in env, module
    workers = json.loads(stack_auth.service_env(tmp_path, "llmbus_services.autoscaler")["LLMBUS_AUTOSCALER_WORKER_ENV"])
    assert (
        workers["LLMBUS_REDIS_USERNAME"] == "engine-worker" and workers["LLMBUS_REDIS_PASSWORD"] == "engine-worker-pw"
    )

    env = stack_auth.redis_env(tmp_path)
    acl = Path(env["REDIS_ACLFILE"]).read_text()
    assert env["REDIS_PASSWORD"] == "admin-pw" and os.environ["LLMBUS_REDIS_PASSWORD"] == "admin-pw"
    users = {line.split()[1]: line for line in acl.splitlines()}
    assert set(users) == {"default", "router", "engine-worker", "gateway", "operator"}  # no archive, no autoscaler
    assert "router-pw" not in acl and hashlib.sha256(b"router-pw").hexdigest() in users["router"]
    assert "%R~llmbus:gateway:apikey:*" in users["gateway"] and "~llmbus:gateway:apikey:*" not in users["router"]


def test_llmbus_acl_redis_users_writes_the_acl_file_from_a_secrets_directory(tmp_path: Path) -> None:
    """compose's secrets-init: `llmbus acl redis-users /secrets -o /secrets/redis-users.acl`."""
    from typer.testing import CliRunner

    from llmbus.cli.main import app

    for name in ("redis", "router", "gateway", "archive"):
        (tmp_path / name).write_text(f"{name}-pw\n")
    out = tmp_path / "redis-users.acl"
    result = CliRunner().invoke(
        app, ["acl", "redis-users", str(tmp_path), "-o", str(out)], env={"LLMBUS_TOPIC_PREFIX": ""}
    )
    assert result.exit_code == 0, result.output
    users = {line.split()[1]: line for line in out.read_text().splitlines()}
    assert set(users) == {"default", "router", "gateway"}  # the archive has no Redis user
    assert f"#{hashlib.sha256(b'redis-pw').hexdigest()}" in users["default"] and "+@all" in users["default"]
    assert "~llmbus:router:*" in users["router"] and "apikey" not in users["router"]
