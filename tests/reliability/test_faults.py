"""Delivery under faults: every scenario must end with 0 lost, 0 doubled, clean chunks, nothing misfiled.

CI runs the short sizes (`-m reliability` selects them); `make reliability` the long ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
    outcome = await SCENARIOS[scenario](SIZE, tmp_path)
    reliability_outcomes.append(outcome)
    assert outcome.report.passed, outcome.report.summary() + "\n" + "\n".join(outcome.notes)
