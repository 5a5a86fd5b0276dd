"""Shared fixtures: the real local Kafka and Redis (started by `make test`), namespaces, services."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from llmbus.bus.admin import delete_topics_matching, ensure_catalog
from llmbus.settings import BusSettings
from tests.support import TEST_NAMESPACE, ServiceProc, drop_namespace, fresh_settings

# One real vLLM CPU engine (tiny random-weight Llama) shared by the whole session.
pytest_plugins = ["tests.fixtures.vllm_engine", "tests.fixtures.secured_kafka"]  # the second: a SASL/ACL broker


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def kafka_up() -> None:
    if not _answers("127.0.0.1", 9092):
        pytest.fail("Kafka is not answering on 127.0.0.1:9092: run `make test` (it starts it) or `make infra`")


@pytest.fixture(scope="session")
def redis_up() -> None:
    if not _answers("127.0.0.1", 6379):
        pytest.fail("Redis is not answering on 127.0.0.1:6379: run `make test` (it starts it) or `make infra`")


def pytest_configure(config: pytest.Config) -> None:
    """`make test` (LLMBUS_TEST_SWEEP=1) first drops test topics that earlier killed runs left behind.

    Off by default: a sweep would also drop the topics of another test run going on at the same time.
    Done here, once, before any test starts: under pytest-xdist this runs in the controller before the
    workers exist (a worker sweeping would drop the namespaces its siblings are using).
    """
    is_xdist_worker = hasattr(config, "workerinput")
    if os.environ.get("LLMBUS_TEST_SWEEP") == "1" and not is_xdist_worker and _answers("127.0.0.1", 9092):
        asyncio.run(delete_topics_matching(BusSettings(), TEST_NAMESPACE))


# Tests that share one expensive session resource run on one pytest-xdist worker (`--dist loadgroup`):
# one vLLM engine per run (and no second engine competing with it for the cores), one secured broker.
_SHARED_BY_FIXTURE = {"vllm_engine": "vllm", "secured_kafka": "secured-kafka"}


def _xdist_group(item: pytest.Item) -> str | None:
    names = set(getattr(item, "fixturenames", ()))
    for fixture, group in _SHARED_BY_FIXTURE.items():
        if fixture in names:
            return group
    if item.get_closest_marker("vllm") is not None:
        return "vllm"
    # A module-scoped fixture (a stack of services, a private Redis) is built once per worker that runs
    # one of the module's tests: keep the module on one worker so it is built once.
    definitions = getattr(item, "_fixtureinfo", None)
    if definitions is not None:
        for defs in definitions.name2fixturedefs.values():
            if any(d.scope == "module" for d in defs):
                return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the marks to name the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None and (group := _xdist_group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
async def bus_settings(kafka_up: None, redis_up: None) -> AsyncIterator[BusSettings]:
    """A fresh topic namespace with the whole catalog created in it (dropped afterwards)."""
    settings = fresh_settings()
    await ensure_catalog(settings)
    yield settings
    await drop_namespace(settings)


@pytest.fixture
def services(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[ServiceProc]]:
    """Append ServiceProc objects (started); all are killed at the end, logs shown on failure."""
    started: list[ServiceProc] = []
    yield started
    failed = getattr(request.node, "rep_call", None)
    for proc in started:
        proc.kill()
        if failed is not None and failed.failed:
            print(f"\n--- log of {proc.name} ---\n{proc.log_tail()}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
