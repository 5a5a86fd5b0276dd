"""Shared fixtures: the real local Kafka, Redis and object store (started by `make test`), namespaces, services."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest

from llmbus.bus.admin import delete_topics_matching, ensure_catalog
from llmbus.settings import BusSettings
from llmbus_tools.harness.forkserver import ENABLE_ENV as FORKSERVER_ENV
from llmbus_tools.harness.service_procs import (
    TEST_NAMESPACE,
    ServiceProc,
    drop_namespace,
    drop_test_keys,
    fresh_settings,
)
from tests import assert_cache, xdist_groups
from tests.leaks import describe, leftovers

# One real vLLM CPU engine (tiny random-weight Llama) shared by the whole session.
pytest_plugins = [
    "tests.fixtures.vllm_engine",
    "tests.fixtures.secured_kafka",
    "tests.fixtures.redis_cluster",
    "tests.fixtures.objectstore",
    "tests.fixtures.buses",  # `on_bus`: one test body in memory and on the real broker
]  # private: SASL/ACL broker, Redis Cluster; the shared local object store


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
    """`make test` (LLMBUS_TEST_SWEEP=1) first drops the test topics that earlier killed runs left behind,
    and the Redis keys of earlier runs' namespaces (kept for days by their TTLs, and across restarts
    by the local Redis's AOF, they made every SCAN of a later run walk them: Redis spent 38 CPU-s in
    a run on a keyspace of 276k leftover keys).

    Off by default: a sweep would also drop the topics and keys of another test run going on at the same time.
    Done here, once, before any test starts: under pytest-xdist this runs in the controller before the
    workers exist (a worker sweeping would drop the namespaces its siblings are using).

    Service processes come from a fork server (llmbus_tools.harness.forkserver) unless
    LLMBUS_FORKSERVER=0: each would otherwise spend a CPU-second on its imports. To save CPU the same
    way, the controller caches the rewritten test modules before its workers collect them
    (tests/assert_cache.py).
    """
    os.environ.setdefault(FORKSERVER_ENV, "1")
    is_xdist_worker = hasattr(config, "workerinput")
    if os.environ.get("LLMBUS_TEST_SWEEP") == "1" and not is_xdist_worker:
        if _answers("127.0.0.1", 9092):
            asyncio.run(delete_topics_matching(BusSettings(), TEST_NAMESPACE))
        if _answers("127.0.0.1", 6379):
            asyncio.run(drop_test_keys(BusSettings().redis_url))
    if not is_xdist_worker and getattr(config.option, "numprocesses", None):
        assert_cache.prewarm(config)
    xdist_groups.name_groups_dir(config)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    result = yield  # after deselection (-m, -k): the table lists the tests this run has
    xdist_groups.write_groups(config, items)
    return result


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`-n N` (xdist's default `--dist load`) or `--dist loadgroup`: tests that share the vLLM engine, the secured
    broker or a module's stack stay on one worker (tests/xdist_groups.py says why xdist's own loadgroup cannot
    do it under pytest 9). Other modes (loadfile, loadscope, each, worksteal) are xdist's own."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    return xdist_groups.SharedResourceScheduling(config, log)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if it left a private Redis or broker running (each one a leak a later run inherits),
    and end them. In the xdist controller: its temporary directory holds every worker's."""
    if hasattr(session.config, "workerinput"):
        return
    left = leftovers(session.config._tmp_path_factory.getbasetemp())
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for proc in left:
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"LEFT RUNNING by this session, now killed: {describe(proc)}", red=True)
        with contextlib.suppress(psutil.Error):
            proc.kill()
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def no_module_under_the_old_services_name() -> Iterator[None]:
    """The services import as llmbus_services; a checkout's root still imports the folder as `services`,
    so code that builds the old name (a module name from a path) would load a second copy unnoticed.
    Checked at the end of each session (each xdist worker's too)."""
    yield
    old = sorted(name for name in sys.modules if name == "services" or name.startswith("services."))
    assert not old, f"imported under the old name `services` (now llmbus_services): {old[:10]}"


def pytest_unconfigure(config: pytest.Config) -> None:
    xdist_groups.remove_groups_dir(config)


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
