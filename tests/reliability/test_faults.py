"""Delivery under faults, as deployed: every scenario (tests/reliability/scenarios, one module each) must end
with 0 lost, 0 doubled, clean chunks, nothing misfiled, no error result its scenario did not allow before
the run, every result billed exactly once with the money conserved, and its own effects exactly once
(docs/reliability.md).

`make test` runs the short sizes of the light scenarios (unmarked); `make reliability` sets
LLMBUS_RELIABILITY=long, which marks them all `reliability` (and `make test` leaves them out). The heavy
ones (more JVMs than `make test` carries on two cores) are always `reliability` and `kafka_cluster`:
at the short size with `-m kafka_cluster`. LLMBUS_RELIABILITY_REQUESTS overrides the number of requests
per scenario (the report says so).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from llmbus.audit import AuditReport
from llmbus_tools.harness.reliability.verdict import Outcome
from llmbus_tools.harness.secured import SecuredBroker
from tests.reliability.common import LONG, SHORT, Run, sized
from tests.reliability.scenarios import SCENARIOS

LONG_RUN = os.environ.get("LLMBUS_RELIABILITY") == "long"
SIZE = sized(LONG if LONG_RUN else SHORT, os.environ.get("LLMBUS_RELIABILITY_REQUESTS"))

pytestmark = [
    *([pytest.mark.reliability] if LONG_RUN else []),
    pytest.mark.kafka,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.timeout(1800 if LONG_RUN else 300),
]


def _marks(name: str) -> list[pytest.MarkDecorator]:
    scenario = SCENARIOS[name]
    marks = [] if LONG_RUN else [pytest.mark.timeout(scenario.short_timeout_s)]
    if scenario.heavy:
        marks += [pytest.mark.reliability, pytest.mark.kafka_cluster]
    if scenario.vllm:
        marks += [pytest.mark.vllm]
    return marks


PARAMS = [pytest.param(name, marks=_marks(name)) for name in sorted(SCENARIOS)]


@pytest.mark.parametrize("scenario", PARAMS)
async def test_no_request_lost_or_doubled_and_every_result_billed_once(
    scenario: str,
    tmp_path: Path,
    kafka_up: None,
    redis_up: None,
    request: pytest.FixtureRequest,
    reliability_outcomes: list[Outcome],
) -> None:
    chosen = SCENARIOS[scenario]
    broker: SecuredBroker | None = None if chosen.own_broker else request.getfixturevalue("deployed_broker")
    started = time.monotonic()
    run = Run(SIZE, tmp_path, broker)
    try:
        outcome = await chosen.run(run)
    except Exception as exc:  # the report shows a scenario that could not even finish
        error = f"{type(exc).__name__}: {exc}"
        reliability_outcomes.append(Outcome(scenario, AuditReport(), time.monotonic() - started, error=error))
        raise
    finally:
        await asyncio.to_thread(run.close)
    reliability_outcomes.append(outcome)
    assert outcome.passed, outcome.verdict() + "\n" + "\n".join(outcome.notes)
