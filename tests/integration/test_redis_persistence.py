"""`make up`'s Redis (deploy/redis/redis.sh) keeps its data across a restart by default: API keys,
exactly-once markers, the cost outbox and held results live there; and the services' clients
(llmbus.state.store.redis_client) go on serving across a Redis crash without a failed command."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from pathlib import Path

import psutil
import redis

from llmbus.state.store import redis_client

REPO = Path(__file__).resolve().parents[2]


SCRIPT = str(REPO / "deploy/redis/redis.sh")


def private_redis(tmp_path: Path) -> tuple[int, dict[str, str]]:
    """A port and the environment for a private instance of redis.sh (persistent, as by default)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "REDIS_APPENDONLY"} | {
        "REDIS_PORT": str(port),
        "REDIS_RUN_DIR": str(tmp_path),
        "REDIS_NAME": "redis-persist",
    }
    return port, env


def test_a_key_written_before_a_stop_is_there_after_the_start(tmp_path: Path) -> None:
    port, env = private_redis(tmp_path)
    try:  # a start that failed its wait may still have left a server: stop it too
        subprocess.run([SCRIPT, "start"], env=env, check=True, timeout=60)
        client = redis.Redis(port=port, socket_timeout=5)
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        client.set("llmbus:test:marker", "kept")
        client.close()
        subprocess.run([SCRIPT, "stop"], env=env, check=True, timeout=60)
        subprocess.run([SCRIPT, "start"], env=env, check=True, timeout=60)
        client = redis.Redis(port=port, socket_timeout=5)
        assert client.get("llmbus:test:marker") == b"kept"
        client.close()
    finally:
        subprocess.run([SCRIPT, "stop"], env=env, check=False, timeout=30)


def test_a_services_client_serves_right_after_redis_is_killed_and_started(tmp_path: Path) -> None:
    # Every connection of the pool was open when Redis died; each must reconnect on its next command
    # instead of failing it (the compose smoke's gateway answered 500 after a Redis restart).
    port, env = private_redis(tmp_path)

    async def scenario() -> list[bytes | None]:
        client = redis_client(f"redis://127.0.0.1:{port}/0", max_connections=8)
        await client.set("llmbus:test:key", "kept")
        await asyncio.gather(*(client.blpop(["llmbus:test:empty"], timeout=0.2) for _ in range(8)))  # 8 open
        pid = int((tmp_path / "redis-persist.pid").read_text())
        await asyncio.sleep(1.5)  # appendfsync everysec: the key is on disk
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(subprocess.run, [SCRIPT, "start"], env=env, check=True, timeout=60)
        # As many commands at once as the pool has connections: each takes one that Redis closed.
        answers = await asyncio.gather(*(client.get("llmbus:test:key") for _ in range(8)))
        await client.aclose()
        return list(answers)

    try:  # a start that failed its wait may still have left a server: stop it too
        subprocess.run([SCRIPT, "start"], env=env, check=True, timeout=60)
        assert asyncio.run(scenario()) == [b"kept"] * 8
    finally:
        subprocess.run([SCRIPT, "stop"], env=env, check=False, timeout=30)


def test_a_stop_ends_a_server_that_does_not_answer(tmp_path: Path) -> None:
    # A stopped server (SIGSTOP) answers no ping and no SHUTDOWN, like one too loaded to answer in time:
    # the old stop hung on its ping (or, had the ping failed, said "not running") and left it running.
    _, env = private_redis(tmp_path)
    try:
        subprocess.run([SCRIPT, "start"], env=env, check=True, timeout=60)
        pid = int((tmp_path / "redis-persist.pid").read_text())
        os.kill(pid, signal.SIGSTOP)
        subprocess.run([SCRIPT, "stop"], env=env, check=True, timeout=60)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        subprocess.run([SCRIPT, "stop"], env=env, check=False, timeout=60)
