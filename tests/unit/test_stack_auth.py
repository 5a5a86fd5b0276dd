"""The secured local stack gives each process its own principal, workers the autoscaler starts included."""

from __future__ import annotations

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
    from llmbus_services.autoscaler.app import build_actuator
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
