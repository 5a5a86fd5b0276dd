"""Reliability scenarios: sizes from LLMBUS_RELIABILITY (short for CI, long for `make reliability`);
with LLMBUS_RELIABILITY_REPORT set, the session writes the report there (.json and .md)."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmbus_tools.harness.reliability.stack import Outcome
from tests.reliability.report import write_report


@pytest.fixture(scope="session")
def reliability_outcomes() -> Iterator[list[Outcome]]:
    outcomes: list[Outcome] = []
    yield outcomes
    target = os.environ.get("LLMBUS_RELIABILITY_REPORT")
    if target and outcomes:
        command = os.environ.get("LLMBUS_RELIABILITY_COMMAND") or shlex.join(["python", *sys.argv[1:]])
        size = os.environ.get("LLMBUS_RELIABILITY", "short")
        if requests := os.environ.get("LLMBUS_RELIABILITY_REQUESTS"):
            size += f", {requests} requests per scenario"
        write_report(outcomes, Path(target), command, size)
