"""The secured local stack gives each process its own principal, workers the autoscaler starts included."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmbus.cli import stack_auth


def test_each_module_connects_as_its_principal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kafka.credentials").write_text("engine-worker=w-pw\nrouter=r-pw\noperator=o-pw\n")
    monkeypatch.delenv("KAFKA_CREDENTIALS", raising=False)
    monkeypatch.delenv("KAFKA_NAME", raising=False)
    monkeypatch.delenv("LLMBUS_STACK_AUTH", raising=False)
    assert stack_auth.service_env(tmp_path, "services.router") == {}  # dev mode: nothing changes
    monkeypatch.setenv("LLMBUS_STACK_AUTH", "1")
    worker = stack_auth.service_env(tmp_path, "services.engine_worker")
    assert worker["LLMBUS_KAFKA_SASL_USERNAME"] == "engine-worker" and worker["LLMBUS_KAFKA_SASL_PASSWORD"] == "w-pw"
    assert stack_auth.service_env(tmp_path, "services.router")["LLMBUS_KAFKA_SASL_USERNAME"] == "router"


def test_compose_secrets_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "engine-worker").write_text("w-pw\n")
    monkeypatch.setenv("KAFKA_CREDENTIALS", str(tmp_path))
    monkeypatch.setenv("LLMBUS_STACK_AUTH", "1")
    assert stack_auth.service_env(tmp_path, "services.engine_worker")["LLMBUS_KAFKA_SASL_PASSWORD"] == "w-pw"
