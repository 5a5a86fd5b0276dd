"""`llmbus workers start` and `llmbus models watch` on the real broker, where they must not wait in vain: a worker
whose version the registry lacks, a worker that dies before its first heartbeat, a model with no release.
(Their good paths run in tests/e2e/test_model_versions.py and tests/e2e/test_model_release.py.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmbus.cli import models as models_cli
from llmbus.cli import workers as workers_cli
from llmbus.cli.main import app
from llmbus.settings import BusSettings

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow]


def llmbus(settings: BusSettings, tmp_path: Path, *args: str, code: int) -> str:
    env = {"LLMBUS_TOPIC_PREFIX": settings.topic_prefix, "LLMBUS_CACHE": str(tmp_path / "cache")}
    models_cli.console.width = workers_cli.console.width = 220
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == code, result.output + repr(result.exception)
    return result.output


async def test_a_worker_of_an_unknown_version_fails_its_start_and_the_command_says_why(
    bus_settings: BusSettings, tmp_path: Path
) -> None:
    started = time.monotonic()
    said = await asyncio.to_thread(
        llmbus, bus_settings, tmp_path, "workers", "start", "nobody@7", "--engine", "sim", "--timeout-s", "120", code=1
    )
    assert "nobody-v7-sim (nobody@7, sim): failed (exit status 3): model_version_unknown: nobody@7" in said, said
    assert time.monotonic() - started < 90  # on the heartbeat, not at the timeout
    assert "not running" in llmbus(bus_settings, tmp_path, "workers", "stop", "nobody-v7-sim", code=0)


async def test_a_worker_that_dies_before_any_heartbeat_is_reported_as_such(
    bus_settings: BusSettings, tmp_path: Path
) -> None:
    said = await asyncio.to_thread(
        llmbus,
        bus_settings,
        tmp_path,
        "workers", "start", "tiny@1", "--engine", "sim", "-e", "LLMBUS_WORKER_MAX_IN_FLIGHT=many", "--timeout-s", "120",
        code=1,
    )  # fmt: skip
    assert "tiny-v1-sim (tiny@1, sim): exited with status 1 before it was ready" in said, said
    assert "max_in_flight" in (tmp_path / "cache" / "run" / "tiny-v1-sim.log").read_text()


def test_watch_names_what_it_cannot_follow(bus_settings: BusSettings, tmp_path: Path) -> None:
    assert "no model 'nobody' on llm.models" in llmbus(bus_settings, tmp_path, "models", "watch", "nobody", code=2)
    llmbus(bus_settings, tmp_path, "models", "register", "plain", code=0)  # a plain model: never released
    assert "plain: no release yet" in llmbus(bus_settings, tmp_path, "models", "watch", "plain", code=2)
