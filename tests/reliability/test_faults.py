"""Delivery under faults: every scenario must end with 0 lost, 0 doubled, clean chunks, nothing misfiled.

CI runs the short sizes (`-m reliability` selects them); `make reliability` the long ones.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from llmbus.audit import AuditReport
from tests.reliability.harness import Outcome
from tests.reliability.scenarios import LONG, SCENARIOS, SHORT

LONG_RUN = os.environ.get("LLMBUS_RELIABILITY") == "long"
SIZE = LONG if LONG_RUN else SHORT

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.kafka,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.timeout(1500 if LONG_RUN else 240),
]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
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
    assert outcome.passed, outcome.report.summary() + "\n" + "\n".join(outcome.notes)
