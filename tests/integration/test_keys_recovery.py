"""API keys survive a Redis data loss by `llmbus keys export` / `llmbus keys import`: on a private
Redis (started here on a free port) a key is created and exported, the instance is FLUSHALLed (the
key no longer authenticates), the export is imported, and the same secret names its tenant again;
a second import restores nothing; the export holds no secret."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from llmbus.cli.main import app
from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.state.store import redis_client
from llmbus_tools.harness.reliability.infra import PrivateRedis

pytestmark = [pytest.mark.redis]

PREFIX = "keys-recovery."


def _cli(url: str, *args: str) -> str:
    env = {"LLMBUS_REDIS_URL": url, "LLMBUS_TOPIC_PREFIX": PREFIX, "COLUMNS": "200"}
    result = CliRunner().invoke(app, ["keys", *args], env=env)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


async def _tenant_of(url: str, secret: str) -> str | None:
    client = redis_client(url)
    try:
        key = await ApiKeyStore(client, gateway_key_namespace(PREFIX)).lookup(secret)
        return key.tenant if key else None
    finally:
        await client.aclose()


def test_keys_come_back_after_a_flushall_from_an_export(tmp_path: Path) -> None:
    instance = PrivateRedis(tmp_path / "redis")
    try:  # a start that failed its wait may still have left a server: stop it too
        instance.start()
        secret = _cli(instance.url, "create", "--tenant", "acme", "--name", "prod").strip().splitlines()[-1]
        other = _cli(instance.url, "create", "--tenant", "globex").strip().splitlines()[-1]
        backup = tmp_path / "keys.jsonl"
        assert "exported 2 key(s)" in _cli(instance.url, "export", str(backup))
        assert stat.S_IMODE(backup.stat().st_mode) == 0o600
        text = backup.read_text()
        assert secret not in text and other not in text and len(text.splitlines()) == 2

        client = redis.Redis(port=instance.port, socket_timeout=5)
        client.flushall()
        client.close()
        assert asyncio.run(_tenant_of(instance.url, secret)) is None  # the data loss: the key is refused

        assert "restored 2 of 2" in _cli(instance.url, "import", str(backup))
        assert asyncio.run(_tenant_of(instance.url, secret)) == "acme"
        assert asyncio.run(_tenant_of(instance.url, other)) == "globex"
        assert "acme" in _cli(instance.url, "list") and "globex" in _cli(instance.url, "list")
        assert "restored 0 of 2" in _cli(instance.url, "import", str(backup))  # idempotent
    finally:
        instance.stop()
