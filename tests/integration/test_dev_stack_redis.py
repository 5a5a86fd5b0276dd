"""`make up`'s Redis keeps its data: the stack turns the append-only file on, even in a Redis
that was already running without it (a private instance of deploy/redis/redis.sh here)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmbus.cli.stack import persist_redis
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_tools.harness.service_procs import REPO


@pytest.fixture
def plain_redis(tmp_path: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = os.environ | {"REDIS_PORT": str(port), "REDIS_RUN_DIR": str(tmp_path), "REDIS_APPENDONLY": "no"}
    script = str(REPO / "deploy/redis/redis.sh")
    try:  # a start that failed its wait may still have left a server: stop it too
        subprocess.run([script, "start"], check=True, env=env, timeout=60)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        subprocess.run([script, "stop"], check=True, env=env, timeout=60)


async def test_the_stack_turns_on_the_append_only_file(plain_redis: str) -> None:
    client = redis_client(plain_redis)
    try:
        assert (await client.config_get("appendonly"))["appendonly"] == "no"
        await persist_redis(BusSettings(redis_url=plain_redis))
        config = await client.config_get("append*")
        assert config["appendonly"] == "yes" and config["appendfsync"] == "everysec"
    finally:
        await client.aclose()
