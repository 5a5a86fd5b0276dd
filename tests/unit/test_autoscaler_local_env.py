"""The local actuator's workers never inherit the autoscaler's own /metrics port."""

from __future__ import annotations

import pytest

from llmbus_services.autoscaler.adapters.actuators.local import LocalActuator
from llmbus_services.autoscaler.core.config import LocalSpec


@pytest.mark.parametrize(("base", "expected"), [(0, ["0", "0"]), (29120, ["29121", "29122"])])
def test_each_worker_gets_its_own_metrics_port_or_none(
    monkeypatch: pytest.MonkeyPatch, base: int, expected: list[str]
) -> None:
    monkeypatch.setenv("LLMBUS_METRICS_PORT", "29106")  # the autoscaler's, which a worker would bind again
    actuator = LocalActuator({"sim-llama-8b": LocalSpec()}, {}, base)
    ports = [actuator.process("sim-llama-8b", index).env["LLMBUS_METRICS_PORT"] for index in (1, 2)]
    assert ports == expected
