"""Redis ACL users, one per service principal, generated from what each service needs.

The Kafka ACLs follow from the topic catalog (llmbus.security.acls); these follow from the key
families below, the same names the services build (llmbus.state.keys and the namespaces each
service gives its stores). A service logs in to Redis as its Kafka principal's name with the same
password (LLMBUS_REDIS_USERNAME, LLMBUS_REDIS_PASSWORD) and reaches only its own keys: the router
cannot write `apikey:<hash>` (and so cannot mint an API key), the gateway can only read API keys,
and the archive, the autoscaler, the node agent, analytics and the tenants have no Redis user at all.

`default` (Redis's own user) keeps every right, under its own password: an operator's backups and
health checks, never a service.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from llmbus.contract import topics as t
from llmbus.security.acls import OPERATOR
from llmbus.security.apikeys import gateway_key_namespace
from llmbus.state.keys import (
    coalesce_key_root,
    cost_key_root,
    experiment_key_root,
    glob_literal,
    legacy_cost_key_root,
)

DEFAULT_USER = "default"
# What a service's stores send: reads, writes, key expiry and scans, scripts, MULTI, connection
# commands, the server's clock (TIME, in no category but @fast: the router's rate limits read it inside
# their script, and fail open without it), and the slot map a cluster client reads. Never a dangerous
# command (KEYS, FLUSHALL, CONFIG, DEBUG, ...), nor one that drops or stops every script (they are other
# services' too).
SERVICE_COMMANDS = (
    "-@all",
    "+@read",
    "+@write",
    "+@keyspace",
    "+@scripting",
    "+@transaction",
    "+@connection",
    "-@dangerous",
    "+time",
    "-script|flush",
    "-script|kill",
    "-function|flush",
    "-function|delete",
    "-function|restore",
    "-function|kill",
    "+cluster|slots",
    "+cluster|shards",
)
LOOKUP_COMMANDS = ("-@all", "+get", "+@connection", "-@dangerous", "+cluster|slots", "+cluster|shards")


@dataclass(frozen=True)
class RedisGrant:
    """One Redis user: the key patterns it may read and write, those it may only read, its commands."""

    user: str
    keys: tuple[str, ...] = ()
    read_keys: tuple[str, ...] = ()
    commands: tuple[str, ...] = SERVICE_COMMANDS

    def render(self, password_sha256: str) -> str:
        """Its line of an ACL file (`user <name> …`): on, its password as a SHA-256, nothing else."""
        rules = ["on", f"#{password_sha256}", "resetkeys", *(f"~{k}" for k in self.keys)]
        rules += [f"%R~{k}" for k in self.read_keys]
        return " ".join(["user", self.user, *rules, "resetchannels", *self.commands])


def grants(topic_prefix: str) -> list[RedisGrant]:
    """Every service principal's Redis user in the namespace `topic_prefix` (users without Redis: none)."""
    p = glob_literal(topic_prefix)
    markers = f"llmbus:{p}worker:*"  # final markers and attempt fences (llmbus.state.store.dispatch_markers)
    api_keys = f"llmbus:{glob_literal(gateway_key_namespace(topic_prefix))}:"
    experiments = glob_literal(experiment_key_root(topic_prefix)) + "*"
    cost = (glob_literal(cost_key_root(topic_prefix)) + "*", glob_literal(legacy_cost_key_root(topic_prefix)) + "*")
    return [
        # cache, rate limits, semantic cache, coalescing (and its keys from before the tag), markers
        RedisGrant(
            t.ROUTER,
            keys=(f"llmbus:{p}router:*", glob_literal(coalesce_key_root(f"{topic_prefix}router")) + "*", markers),
        ),
        RedisGrant(t.SCHEDULER, keys=(f"llmbus:{p}scheduler:*", markers)),
        RedisGrant(t.WORKER, keys=(markers,)),
        RedisGrant(t.COST, keys=cost),  # the legacy names too: it moves them to the tagged ones
        RedisGrant(t.COMPARATOR, keys=(f"llmbus:{p}comparator:*", experiments)),
        RedisGrant(t.GATEWAY, read_keys=(f"{api_keys}apikey:*",), commands=LOOKUP_COMMANDS),
        # `llmbus keys`, `llmbus experiments`, `llmbus gc`, `llmbus costs`
        RedisGrant(OPERATOR, keys=(f"{api_keys}apikey:*", f"{api_keys}apikeys", experiments, *cost)),
    ]


def users_with_redis(topic_prefix: str = "") -> set[str]:
    return {grant.user for grant in grants(topic_prefix)}


def acl_file(topic_prefix: str, passwords: Mapping[str, str], default_password: str) -> str:
    """An ACL file (Redis's `aclfile`): `default` with every right, then each service's user, passwords
    stored as their SHA-256 (the file holds no password). A principal without a password is left out."""
    lines = [f"user {DEFAULT_USER} on #{_sha256(default_password)} ~* &* +@all"]
    for grant in grants(topic_prefix):
        if (password := passwords.get(grant.user)) is not None:
            lines.append(grant.render(_sha256(password)))
    return "\n".join(lines) + "\n"


def _sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()
