"""Delivery under faults: every scenario must end with 0 lost, 0 doubled, clean chunks, nothing misfiled,
no error results beyond the bound it fixed before the run, and its downstream effects (billing,
comparisons) exactly once (docs/reliability.md).

`make test` runs the short sizes (unmarked); `make reliability` sets LLMBUS_RELIABILITY=long, which
marks them `reliability` (and `make test` leaves them out). LLMBUS_RELIABILITY_REQUESTS overrides
the number of requests per scenario (the report says so).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from llmbus.audit import AuditReport
from llmbus_tools.harness.reliability.stack import Outcome
from tests.reliability.cluster_scenarios import CLUSTER_SCENARIOS
from tests.reliability.scenarios import LONG, SHORT, sized
from tests.reliability.scenarios import SCENARIOS as DELIVERY_SCENARIOS
from tests.reliability.service_scenarios import SERVICE_SCENARIOS

SCENARIOS = DELIVERY_SCENARIOS | SERVICE_SCENARIOS | CLUSTER_SCENARIOS

LONG_RUN = os.environ.get("LLMBUS_RELIABILITY") == "long"
SIZE = sized(LONG if LONG_RUN else SHORT, os.environ.get("LLMBUS_RELIABILITY_REQUESTS"))

pytestmark = [
    *([pytest.mark.reliability] if LONG_RUN else []),
    pytest.mark.kafka,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.timeout(1500 if LONG_RUN else 300),
]


def _marks(name: str) -> list[pytest.MarkDecorator]:
    if name in CLUSTER_SCENARIOS:
        # Three broker JVMs beside the stack: too heavy for `make test` on two cores, so always
        # `reliability` (`make reliability`, `make reliability-cluster`); short sizes by hand with -m.
        return [pytest.mark.reliability, pytest.mark.kafka_cluster, pytest.mark.timeout(1500 if LONG_RUN else 900)]
    if name == "broker_restart" and not LONG_RUN:
        return [pytest.mark.timeout(600)]  # a private broker is a JVM started twice: room on two busy cores
    return []


PARAMS = [pytest.param(name, marks=_marks(name)) for name in SCENARIOS]


@pytest.mark.parametrize("scenario", PARAMS)
async def test_no_request_lost_or_doubled(
    scenario: str, tmp_path: Path, kafka_up: None, redis_up: None, reliability_outcomes: list[Outcome]
) -> None:
    started = time.monotonic()
    try:
        outcome = await SCENARIOS[scenario](SIZE, tmp_path)
    except Exception as exc:  # the report shows a scenario that could not even finish
        error = f"{type(exc).__name__}: {exc}"
        reliability_outcomes.append(Outcome(scenario, AuditReport(), time.monotonic() - started, error=error))
        raise
    reliability_outcomes.append(outcome)
    assert outcome.passed, outcome.verdict() + "\n" + "\n".join(outcome.notes)
