"""`llmbus keys create|revoke|list|export|import`: the gateway's API keys (each maps to one tenant).

`export` writes what Redis keeps (key id, tenant, name, creation time, the SHA-256 of the secret;
never a secret) as JSON lines; `import` puts back the keys Redis lacks: after Redis lost its data,
every key issued before the export authenticates again, nothing to reissue."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import typer
from rich.console import Console
from rich.table import Table

from llmbus.security.apikeys import ApiKeyStore, StoredKey, gateway_key_namespace
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client

app = typer.Typer(help="API keys of the OpenAI-compatible gateway (stored hashed in Redis)", no_args_is_help=True)
console = Console()
T = TypeVar("T")


def _with_store(action: Callable[[ApiKeyStore], Awaitable[T]]) -> T:
    async def _run() -> T:
        settings = BusSettings()
        client = redis_client(
            settings.redis_url, max_connections=2, password=settings.redis_password, cluster=settings.redis_cluster
        )
        try:
            return await action(ApiKeyStore(client, gateway_key_namespace(settings.topic_prefix)))
        finally:
            await client.aclose()

    return asyncio.run(_run())


@app.command()
def create(
    tenant: str = typer.Option(..., help="the tenant every request made with this key belongs to"),
    name: str = typer.Option("", help="a note to recognise the key by"),
) -> None:
    """Create a key; the secret is printed once (only its hash is stored)."""
    secret, record = _with_store(lambda store: store.create(tenant, name))
    console.print(f"key id  {record.key_id}  tenant {record.tenant}", highlight=False)
    print(secret)  # alone on its line, so scripts can take it with `| tail -1`


@app.command()
def revoke(key_id: str) -> None:
    """Revoke a key by its id: requests carrying it are refused from now on."""
    if not _with_store(lambda store: store.revoke(key_id)):
        console.print(f"[red]no key {key_id}[/red]")
        raise typer.Exit(1)
    console.print(f"revoked {key_id}")


@app.command("list")
def list_keys() -> None:
    """Every key's id, tenant, name and creation time (never the secret)."""
    table = Table("key id", "tenant", "name", "created (UTC)")
    for key in _with_store(lambda store: store.list()):
        created = datetime.fromtimestamp(key.created_at_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")
        table.add_row(key.key_id, key.tenant, key.name, created)
    console.print(table)


@app.command("export")
def export_keys(path: Path = typer.Argument(..., help="file to write (JSON lines, created mode 0600)")) -> None:
    """Back up every key's stored hash and facts (no secret) for `llmbus keys import`."""
    keys = _with_store(lambda store: store.export())
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text("".join(key.model_dump_json() + "\n" for key in keys))
    console.print(f"exported {len(keys)} key(s) to {path}")


@app.command("import")
def import_keys(
    path: Path = typer.Argument(..., exists=True, dir_okay=False, help="a `llmbus keys export` file"),
) -> None:
    """Put back the exported keys Redis does not have (after a Redis data loss): they work again."""
    keys = [StoredKey.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]
    restored = _with_store(lambda store: store.restore(keys))
    console.print(f"restored {restored} of {len(keys)} key(s); {len(keys) - restored} were there already")
