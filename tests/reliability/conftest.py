"""Reliability scenarios: sizes from LLMBUS_RELIABILITY (short for CI, long for `make reliability`);
with LLMBUS_RELIABILITY_REPORT set, the session writes the report there (.json, .md and .png).

`deployed_broker`: a secured broker (SASL/SCRAM, ACLs enforced, the load's tenants among its principals)
that the scenarios which do not break a broker share, one per test process (pytest-xdist spreads the
scenarios over its workers: each that runs one starts its own)."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmbus_tools.harness.reliability.deployment import TENANTS
from llmbus_tools.harness.reliability.infra import PrivateKafka
from llmbus_tools.harness.reliability.verdict import Outcome
from llmbus_tools.harness.secured import SecuredBroker
from tests.reliability.report import write_report

# A broker for the whole session: the quick compiler alone and the serial collector (as the secured
# broker of tests/fixtures/secured_kafka.py).
SESSION_BROKER_JVM_FLAGS = "-Xmx512m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="session")
def deployed_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    kafka = PrivateKafka(tmp_path_factory.mktemp("deployed-kafka"), jvm_flags=SESSION_BROKER_JVM_FLAGS, tenants=TENANTS)
    kafka.start()
    try:
        yield kafka.secured
    finally:
        kafka.stop()


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
