"""`make up`'s Redis (deploy/redis/redis.sh) keeps its data across a restart by default: API keys,
exactly-once markers, the cost outbox and held results live there."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[2]


def test_a_key_written_before_a_stop_is_there_after_the_start(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "REDIS_APPENDONLY"} | {
        "REDIS_PORT": str(port),
        "REDIS_RUN_DIR": str(tmp_path),
        "REDIS_NAME": "redis-persist",
    }
    script = str(REPO / "deploy/redis/redis.sh")
    subprocess.run([script, "start"], env=env, check=True, timeout=60)
    try:
        client = redis.Redis(port=port, socket_timeout=5)
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        client.set("llmbus:test:marker", "kept")
        client.close()
        subprocess.run([script, "stop"], env=env, check=True, timeout=60)
        subprocess.run([script, "start"], env=env, check=True, timeout=60)
        client = redis.Redis(port=port, socket_timeout=5)
        assert client.get("llmbus:test:marker") == b"kept"
        client.close()
    finally:
        subprocess.run([script, "stop"], env=env, check=False, timeout=30)
