"""`llmbus acl print|apply|credentials|redis-users`: the broker's ACLs, generated from the topic catalog
(llmbus.security.acls), the stack's passwords, and Redis's ACL file (llmbus.security.redis_acls)."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import typer
from rich.console import Console

from llmbus.bus.acl_admin import apply_acls
from llmbus.bus.admin import ensure_topics
from llmbus.cli.stack_auth import read_credentials
from llmbus.contract.topics import Topics
from llmbus.security import acls as a
from llmbus.security import redis_acls
from llmbus.settings import BusSettings

app = typer.Typer(help="Kafka ACLs from the topic catalog (services, operators, tenants)", no_args_is_help=True)
console = Console()
TENANTS = typer.Option([], "--tenant", "-t", help="a tenant to allow (repeat); its principal is tenant-<name>")


def _acls(tenants: list[str]) -> list[a.Acl]:
    try:
        return a.all_acls(BusSettings().topic_prefix, tenants)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


@app.command("print")
def print_acls(tenants: list[str] = TENANTS) -> None:
    """Print the ACLs for this namespace (LLMBUS_TOPIC_PREFIX) and the given tenants."""
    for acl in _acls(tenants):
        console.print(acl.render(), highlight=False)


@app.command()
def apply(
    tenants: list[str] = TENANTS,
    create_topics: bool = typer.Option(True, help="also create each tenant's request, reply and feedback topics"),
) -> None:
    """Apply the ACLs (as the broker's super user: LLMBUS_KAFKA_SASL_USERNAME=admin ...)."""
    acls = _acls(tenants)
    settings = BusSettings()
    if not settings.auth_enabled:
        console.print("[yellow]LLMBUS_KAFKA_SECURITY_PROTOCOL is PLAINTEXT: the broker may not enforce ACLs[/yellow]")
    sent = asyncio.run(apply_acls(settings, acls))
    console.print(f"{sent} ACLs applied")
    if create_topics and tenants:
        topics = Topics(settings.topic_prefix)
        wanted = [(topics.name(name), spec) for tenant in tenants for name, spec in a.tenant_topics(tenant)]
        created = asyncio.run(ensure_topics(settings, wanted))
        console.print(f"tenant topics: {len(created)} created, {len(wanted) - len(created)} already there")


@app.command()
def credentials(
    directory: Path = typer.Argument(
        ..., help="one file per principal (its password), plus `redis` and `objectstore` (its secret key)"
    ),
    tenants: list[str] = TENANTS,
) -> None:
    """Generate the passwords a secured stack needs, where missing (compose's secrets-init step)."""
    directory.mkdir(parents=True, exist_ok=True)
    made = 0
    for name in [*a.principals(tenants), "redis", "objectstore"]:  # objectstore: its secret key
        path = directory / name
        if not path.exists():
            path.write_text(secrets.token_urlsafe(24))
            path.chmod(0o644)  # read by the stack's own containers (other users) through the volume
            made += 1
    console.print(f"{made} credentials generated in {directory}")


@app.command("redis-users")
def redis_users(
    credentials: Path = typer.Argument(
        ..., help="one file per principal (its password), as `credentials` writes them; or kafka.sh's credentials file"
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="write the ACL file here (default: print it)"),
    default_from: str = typer.Option("redis", help="whose password Redis's `default` user (every right) gets"),
) -> None:
    """Redis's ACL file for this namespace (LLMBUS_TOPIC_PREFIX): each service's user with its own password
    (its Kafka principal's) and only its keys and commands; passwords as SHA-256. Load it with `aclfile`."""
    passwords = read_credentials(credentials)
    if default_from not in passwords:
        raise typer.BadParameter(f"{credentials} has no password for {default_from!r}")
    text = redis_acls.acl_file(BusSettings().topic_prefix, passwords, passwords[default_from])
    if out is None:
        console.print(text, end="", highlight=False, soft_wrap=True)
        return
    out.write_text(text)
    out.chmod(0o644)  # read by the Redis container (another user) through the secrets volume
    users = len(text.splitlines())
    console.print(f"{users} Redis users written to {out}")
