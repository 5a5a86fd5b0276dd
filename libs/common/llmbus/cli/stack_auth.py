"""`make up AUTH=1`: the local stack on a secured broker (deploy/kafka/kafka.sh KAFKA_AUTH=scram) and a
Redis with one ACL user per service (llmbus.security.redis_acls).

Each service process connects as its own principal with the password kafka.sh generated, to Kafka and
(where it has a Redis user) to Redis; the `llmbus` CLI that brings the stack up speaks as the broker's
super user (it creates the topics and applies the catalog's ACLs) and as Redis's `default` user.
Off (the default), nothing here changes anything.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from llmbus.bus.acl_admin import apply_acls
from llmbus.bus.admin import ensure_topics
from llmbus.contract import topics as t
from llmbus.security import acls, redis_acls
from llmbus.settings import BusSettings

# The module a stack process runs → the principal it connects as (workers the autoscaler starts too).
_PRINCIPALS = {
    "llmbus_services.router": t.ROUTER,
    "llmbus_services.scheduler": t.SCHEDULER,
    "llmbus_services.engine_worker": t.WORKER,
    "llmbus_services.cost_accounting": t.COST,
    "llmbus_services.shadow_comparator": t.COMPARATOR,
    "llmbus_services.gateway": t.GATEWAY,
    "llmbus_services.autoscaler": t.AUTOSCALER,
    "llmbus_services.archive": t.ARCHIVE,
    "llmbus_services.node_agent": t.NODE_AGENT,
}


def secured() -> bool:
    return os.environ.get("LLMBUS_STACK_AUTH") == "1"


def tenants() -> list[str]:
    return os.environ.get("KAFKA_TENANTS", "acme globex").split()


def read_credentials(path: Path) -> dict[str, str]:
    """kafka.sh's credentials file (user=password lines), or a directory of one file per user (compose)."""
    if path.is_dir():
        return {file.name: file.read_text().strip() for file in path.iterdir() if file.is_file()}
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def _credentials(run_dir: Path) -> dict[str, str]:
    return read_credentials(
        Path(os.environ.get("KAFKA_CREDENTIALS", run_dir / f"{os.environ.get('KAFKA_NAME', 'kafka')}.credentials"))
    )


def principal_env(run_dir: Path, user: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
    """A principal's Kafka identity and, for a principal with a Redis user, its Redis one (same password)."""
    password = _credentials(run_dir)[user]
    env = {
        "LLMBUS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "LLMBUS_KAFKA_SASL_MECHANISM": mechanism,
        "LLMBUS_KAFKA_SASL_USERNAME": user,
        "LLMBUS_KAFKA_SASL_PASSWORD": password,
    }
    if user in redis_acls.users_with_redis():
        env |= {"LLMBUS_REDIS_USERNAME": user, "LLMBUS_REDIS_PASSWORD": password}
    return env


def service_env(run_dir: Path, module: str) -> dict[str, str]:
    """The environment a stack process needs on a secured stack; {} when the stack is not secured."""
    if not secured():
        return {}
    env = principal_env(run_dir, _PRINCIPALS.get(module, acls.OPERATOR))
    if module == "llmbus_services.autoscaler":  # the workers its local actuator starts connect as workers
        env["LLMBUS_AUTOSCALER_WORKER_ENV"] = json.dumps(principal_env(run_dir, t.WORKER))
    return env


def redis_env(run_dir: Path) -> dict[str, str]:
    """What deploy/redis/redis.sh needs for a secured stack: the ACL file (written here, from the
    principals' passwords: every service its own user) and the `default` user's password (the broker's
    super user's, which this process uses from now on); {} when the stack is not secured."""
    if not secured():
        return {}
    passwords = _credentials(run_dir)
    acl_file = run_dir / "redis-users.acl"
    acl_file.write_text(redis_acls.acl_file(BusSettings().topic_prefix, passwords, passwords["admin"]))
    acl_file.chmod(0o600)
    os.environ["LLMBUS_REDIS_PASSWORD"] = passwords["admin"]  # this CLI: Redis's `default` user
    return {"REDIS_ACLFILE": str(acl_file), "REDIS_PASSWORD": passwords["admin"]}


def secure_broker(run_dir: Path) -> None:
    """As the super user: this process's own identity from here on, the ACLs, the tenants' topics."""
    os.environ.update(principal_env(run_dir, "admin"))
    settings = BusSettings()
    topics = t.Topics(settings.topic_prefix)

    async def _apply() -> None:
        await apply_acls(settings, acls.all_acls(settings.topic_prefix, tenants()))
        wanted = [(topics.name(n), spec) for tenant in tenants() for n, spec in acls.tenant_topics(tenant)]
        await ensure_topics(settings, wanted)

    asyncio.run(_apply())


def speak_as_tenant(run_dir: Path) -> None:
    """The demo's request comes from a tenant (its own request and reply topics), as a real client's would."""
    if secured():
        os.environ.update(principal_env(run_dir, acls.tenant_principal(tenants()[0])))
