"""Redis AUTH: a private instance from deploy/redis/redis.sh with REDIS_PASSWORD; llmbus clients pass the secret."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.exceptions
from pydantic import SecretStr

from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_tools.harness.service_procs import REPO

PASSWORD = "not-in-any-log-" + os.urandom(6).hex()


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir: Path = tmp_path_factory.mktemp("redis-auth")
    env = os.environ | {
        "REDIS_PORT": str(port),
        "REDIS_RUN_DIR": str(run_dir),
        "REDIS_NAME": "redis-auth",
        "REDIS_PASSWORD": PASSWORD,
    }
    script = str(REPO / "deploy/redis/redis.sh")
    try:  # a start that failed its wait may still have left a server: stop it too
        subprocess.run([script, "start"], env=env, check=True, timeout=60)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        subprocess.run([script, "stop"], env=env, check=False, timeout=30)


async def test_without_the_password_redis_refuses_and_with_it_answers(redis_with_password: str) -> None:
    anonymous = redis_client(redis_with_password, max_connections=2)
    with pytest.raises(redis.exceptions.AuthenticationError):
        await anonymous.ping()
    await anonymous.aclose()
    settings = BusSettings(redis_url=redis_with_password, redis_password=SecretStr(PASSWORD))
    client = redis_client(settings.redis_url, max_connections=2, password=settings.redis_password)
    assert await client.ping()
    await client.aclose()


def test_secrets_never_show_in_reprs() -> None:
    settings = BusSettings(
        redis_password=SecretStr(PASSWORD),
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_username="router",
        kafka_sasl_password=SecretStr(PASSWORD),
    )
    assert PASSWORD not in repr(settings) and PASSWORD not in str(settings.model_dump())
