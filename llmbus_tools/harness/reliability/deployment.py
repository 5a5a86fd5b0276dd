"""A scenario's stack as a deployment runs it: on a secured broker (SASL/SCRAM, the ACLs generated from the
contracts), every service as its own principal with the shipped defaults, the load as its tenants, the
harness's readers as the operator and its administration (ACLs, topics, group look-ups) as the broker's
admin. On a Redis of its own (`with_redis`), Redis is secured the same way: one ACL user per service
principal (llmbus.security.redis_acls, each with its broker password, as `make up AUTH=1` gives them),
and the harness's own Redis reads and writes as Redis's `default` user, as an operator's.

Nothing here changes a service's settings: a scenario that needs another value passes it to the one
service it concerns, and says why (docs/reliability.md lists each one). `Deployment.plain` runs the same
parts on a broker without authentication (the soak benchmark: memory and lag over time, not faults).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import SecretStr

from llmbus.bus.admin import ensure_catalog
from llmbus.contract import topics as t
from llmbus.security import redis_acls
from llmbus.security.tenancy import default_reply_topic, request_topic
from llmbus.settings import BusSettings
from llmbus_tools.harness.reliability.infra import PrivateRedis
from llmbus_tools.harness.secured import ADMIN, OPERATOR, SecuredBroker, secure_namespace
from llmbus_tools.harness.service_procs import fresh_settings

# The load's tenants: per-tenant rate limits (50/s each by default) stay out of the way at 40/s.
TENANTS = [f"rel-{i}" for i in range(8)]


@dataclass
class Deployment:
    broker: SecuredBroker | None  # None: a broker without authentication (every part the same client)
    base: BusSettings = field(default_factory=fresh_settings)  # the namespace, Redis and shipped defaults
    tenants: list[str] = field(default_factory=lambda: list(TENANTS))
    # Its own Redis with the namespace's ACL users (`with_redis`); None: base's Redis, without users.
    redis: PrivateRedis | None = None

    @classmethod
    def on(cls, broker: SecuredBroker, **overrides: object) -> Deployment:
        """A fresh namespace on `broker`; `overrides` of the bus settings every part shares (Redis, a
        replicated broker's replication factor)."""
        return cls(broker, fresh_settings(kafka_bootstrap=broker.bootstrap, **overrides))

    @classmethod
    def plain(cls, settings: BusSettings) -> Deployment:
        return cls(None, settings)

    def own_redis(self, run_dir: Path) -> PrivateRedis:
        """A Redis (not started) as deployed for this namespace: a user per service principal with its
        broker password, reaching only its own keys, and `default` under the broker admin's password."""
        assert self.broker is not None, "Redis users need the principals' passwords"
        credentials = self.broker.credentials
        acl = redis_acls.acl_file(self.prefix, credentials, credentials[ADMIN])
        return PrivateRedis(run_dir, acl=acl, password=credentials[ADMIN])

    def with_redis(self, redis: PrivateRedis) -> Deployment:
        """This deployment on `redis` (from `own_redis`): each service logs in as its own user."""
        return replace(self, base=self.base.model_copy(update={"redis_url": redis.url}), redis=redis)

    @property
    def redis_users(self) -> bool:
        return self.redis is not None and self.redis.acl is not None

    @property
    def prefix(self) -> str:
        return self.base.topic_prefix

    @property
    def topics(self) -> t.Topics:
        return t.Topics(self.prefix)

    def settings(self, principal: str) -> BusSettings:
        return self.base if self.broker is None else self.broker.as_user(principal, self.base)

    @property
    def operator(self) -> BusSettings:
        """What the harness reads the namespace as (the audit, the answers, the bills; Redis as `default`)."""
        return self._redis_admin(self.settings(OPERATOR))

    @property
    def admin(self) -> BusSettings:
        """The broker's super user: ACLs, topics, consumer groups described (Redis as `default`)."""
        return self._redis_admin(self.settings(ADMIN))

    def _redis_admin(self, settings: BusSettings) -> BusSettings:
        if self.redis is None or self.redis.password is None:
            return settings
        return settings.model_copy(update={"redis_password": SecretStr(self.redis.password)})

    def tenant(self, tenant: str) -> BusSettings:
        return self.base if self.broker is None else self.broker.tenant(tenant, self.base)

    def env(self, principal: str) -> dict[str, str]:
        """A service process's credentials (its namespace and Redis come from ServiceProc's settings): its
        broker principal's and, on Redis users, its Redis user's (the same name and password)."""
        if self.broker is None:
            return {}
        env = self.broker.env(principal)
        if self.redis_users and principal in redis_acls.users_with_redis():
            env |= {"LLMBUS_REDIS_USERNAME": principal, "LLMBUS_REDIS_PASSWORD": self.broker.credentials[principal]}
        return env

    def request_topic(self, tenant: str) -> str:
        """Where a tenant's requests go: its own topic when the broker authenticates it."""
        return self.topics.name(t.REQUESTS if self.broker is None else request_topic(tenant))

    def reply_topic(self, tenant: str) -> str:
        return self.topics.name(default_reply_topic(self.broker is not None, tenant))

    async def prepare(self) -> None:
        """The namespace's ACLs, catalog and tenant topics, as `llmbus acl apply` makes them."""
        if self.broker is None:
            await ensure_catalog(self.base)
        else:
            await secure_namespace(self.broker, self.base, self.tenants)
