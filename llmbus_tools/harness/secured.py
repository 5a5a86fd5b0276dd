"""A secured broker as deployments run it (SASL/SCRAM, ACLs generated from the contracts), for tests and
benchmarks: where it is, every principal's password, and a namespace made ready on it.

deploy/kafka/kafka.sh starts one (KAFKA_AUTH=scram) and writes the principals' passwords to a
credentials file (`user=password` lines): `admin` (the broker's super user), one per service, `operator`,
`analytics` and `tenant-<name>` per tenant it was told of.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from llmbus.bus.acl_admin import apply_acls
from llmbus.bus.admin import ensure_catalog, ensure_topics
from llmbus.contract import topics as t
from llmbus.security.acls import all_acls, tenant_principal, tenant_topics
from llmbus.settings import BusSettings

ADMIN = "admin"
OPERATOR = "operator"


def read_credentials(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


@dataclass(frozen=True)
class SecuredBroker:
    bootstrap: str
    credentials: dict[str, str]
    tls_bootstrap: str | None = None  # the SASL_SSL listener (KAFKA_TLS=1), when there is one
    ca_file: str | None = None  # the local CA that signed its certificate

    def env(self, user: str) -> dict[str, str]:
        """What a service process needs to connect as `user`."""
        return {
            "LLMBUS_KAFKA_BOOTSTRAP": self.bootstrap,
            "LLMBUS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "LLMBUS_KAFKA_SASL_USERNAME": user,
            "LLMBUS_KAFKA_SASL_PASSWORD": self.credentials[user],
        }

    def as_user(self, user: str, base: BusSettings) -> BusSettings:
        """`base` (its namespace, Redis, timeouts) connected to this broker as `user`."""
        return base.model_copy(
            update={
                "kafka_bootstrap": self.bootstrap,
                "kafka_security_protocol": "SASL_PLAINTEXT",
                "kafka_sasl_username": user,
                "kafka_sasl_password": SecretStr(self.credentials[user]),
            }
        )

    def tenant(self, tenant: str, base: BusSettings) -> BusSettings:
        return self.as_user(tenant_principal(tenant), base)


async def secure_namespace(broker: SecuredBroker, base: BusSettings, tenants: list[str]) -> None:
    """The namespace of `base` made ready on `broker` as an operator would: its ACLs (services, operator,
    the tenants), the catalog's topics and each tenant's request, reply and feedback topics."""
    admin = broker.as_user(ADMIN, base)
    prefix = base.topic_prefix
    await apply_acls(admin, all_acls(prefix, tenants))
    await ensure_catalog(admin)
    names = t.Topics(prefix)
    await ensure_topics(admin, [(names.name(name), spec) for tenant in tenants for name, spec in tenant_topics(tenant)])
