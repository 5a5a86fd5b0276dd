"""Kafka ACLs generated from the topic catalog's writers and readers: the one source of truth.

Pure: a list of `Acl`s for a namespace, services and tenants; llmbus.bus.acl_admin applies
them and `llmbus acl print|apply` shows and applies them.

Principals (SCRAM users created by deploy/kafka/kafka.sh): one per service (its catalog
role name: `router`, `engine-worker`, ...), `operator` (people and CLIs: the catalog's
`client` writes to llm.control, llm.models, llm.experiments, llm.pricebook, and every read),
`analytics` (stream-analytics jobs: reads the catalog's `analytics` topics -- results, costs,
comparisons, decisions, scaling, budgets, workers -- never a prompt, and writes nothing; its
consumer groups are `llmbus.analytics*`), and `tenant-<name>` per tenant, which may only:
  - write its own request topic `llm.requests.<tenant>` and feedback topic `llm.feedback.<tenant>`
    (the shared `llm.requests` and `llm.feedback` only the gateway writes, which knows the API key);
  - read its own replies `llm.replies.<tenant>` and `llm.replies.<tenant>.<suffix>`.
`admin` is the broker's super user and needs no ACL. With no ACL the broker refuses
(allow.everyone.if.no.acl.found=false), so everything not listed here is denied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmbus.contract import topics as t
from llmbus.security import tenancy

ResourceType = Literal["topic", "group"]
PatternType = Literal["literal", "prefixed"]
Operation = Literal["read", "write", "describe", "create"]

OPERATOR = "operator"
TENANT_PRINCIPAL_PREFIX = tenancy.TENANT_PRINCIPAL_PREFIX
GATEWAY_INSTANCE_PREFIX = tenancy.RESERVED_TENANT_PREFIXES[0]  # gateway reply topics: llm.replies.gw-*
ANALYTICS = t.ANALYTICS
# Catalog roles that are people or their tools, not services: their rights go to `operator`.
OPERATOR_ROLES = (t.CLIENT,)
# Shared topics a tenant writes through its own copy (<name>.<tenant>) when auth is on.
TENANT_WRITTEN = (t.REQUESTS, t.FEEDBACK)


@dataclass(frozen=True, order=True)
class Acl:
    principal: str  # the SCRAM user name (Kafka principal User:<name>)
    resource_type: ResourceType
    pattern: PatternType
    name: str
    operation: Operation

    def render(self) -> str:
        return f"User:{self.principal:<22} {self.operation:<8} {self.resource_type:<5} {self.pattern:<8} {self.name}"


def tenant_principal(tenant: str) -> str:
    return TENANT_PRINCIPAL_PREFIX + tenant


def _principal(role: str) -> str:
    return OPERATOR if role in OPERATOR_ROLES else role


def _topic_acls(prefix: str, pattern: PatternType, name: str, writers: tuple[str, ...], readers: tuple[str, ...]):  # type: ignore[no-untyped-def]
    for role in writers:
        yield Acl(_principal(role), "topic", pattern, prefix + name, "write")
    for role in readers:
        yield Acl(_principal(role), "topic", pattern, prefix + name, "read")


def service_acls(prefix: str) -> list[Acl]:
    """Services and operators, from the catalog (plus the per-instance topics and consumer groups)."""
    acls: set[Acl] = set()
    for spec in t.CATALOG:
        # Tenants write their own request and feedback topics; the shared ones only the gateway (it knows the key).
        writers = (t.GATEWAY,) if spec.name in TENANT_WRITTEN else spec.writers
        acls.update(_topic_acls(prefix, "literal", spec.name, writers, spec.readers))
    acls.update(_topic_acls(prefix, "prefixed", t.DISPATCH_PREFIX, t.DISPATCH_SPEC.writers, t.DISPATCH_SPEC.readers))
    # Every reply topic (a tenant's or a gateway instance's) receives chunks from the services that end requests.
    acls.update(_topic_acls(prefix, "prefixed", t.REPLIES_PREFIX, t.REPLIES_SPEC.writers, ()))
    # Workers read a cut answer's chunks back to continue it (they wrote them: nothing a tenant could hide).
    acls.add(Acl(t.WORKER, "topic", "prefixed", prefix + t.REPLIES_PREFIX, "read"))
    gateway_replies = prefix + t.REPLIES_PREFIX + GATEWAY_INSTANCE_PREFIX
    acls |= {
        Acl(t.GATEWAY, "topic", "prefixed", gateway_replies, "read"),
        Acl(t.GATEWAY, "topic", "prefixed", gateway_replies, "create"),  # each instance creates its own
        Acl(t.WORKER, "topic", "prefixed", prefix + t.DISPATCH_PREFIX, "create"),  # each worker creates its own
        Acl(t.ROUTER, "topic", "prefixed", prefix + tenancy.TENANT_REQUESTS_PREFIX, "read"),
        Acl(t.ARCHIVE, "topic", "prefixed", prefix + tenancy.TENANT_REQUESTS_PREFIX, "read"),  # the prompts
    }
    feedback = t.FEEDBACK_TENANT_SPEC
    acls.update(_topic_acls(prefix, "prefixed", tenancy.TENANT_FEEDBACK_PREFIX, (), feedback.readers))
    for service in (*t.ALL_SERVICES, ANALYTICS):  # consumer groups in the namespace: <prefix>llmbus.<name>[.<suffix>]
        acls.add(Acl(service, "group", "prefixed", f"{prefix}llmbus.{service}", "read"))
    # Operators see every topic of the namespace (trace, audit, fleet status) and create the catalog.
    acls |= {
        Acl(OPERATOR, "topic", "prefixed", prefix + "llm.", "read"),
        Acl(OPERATOR, "topic", "prefixed", prefix + "llm.", "describe"),
        Acl(OPERATOR, "topic", "prefixed", prefix + "llm.", "create"),
        Acl(OPERATOR, "group", "prefixed", f"{prefix}llmbus.{OPERATOR}", "read"),
    }
    return sorted(acls)


def tenant_acls(prefix: str, tenant: str) -> list[Acl]:
    if problem := tenancy.tenant_name_problem(tenant):
        raise ValueError(problem)
    principal = tenant_principal(tenant)
    replies = prefix + tenancy.tenant_reply_topic(tenant)
    return sorted(
        {
            Acl(principal, "topic", "literal", prefix + tenancy.request_topic(tenant), "write"),
            Acl(principal, "topic", "literal", prefix + tenancy.feedback_topic(tenant), "write"),
            Acl(principal, "topic", "literal", replies, "read"),
            # The dot keeps `llm.replies.acme` from covering `llm.replies.acmex` (tenant names have no dots).
            Acl(principal, "topic", "prefixed", replies + ".", "read"),
            Acl(principal, "group", "prefixed", f"{prefix}{principal}.", "read"),
        }
    )


def all_acls(prefix: str, tenants: list[str]) -> list[Acl]:
    acls = service_acls(prefix)
    for tenant in tenants:
        acls += tenant_acls(prefix, tenant)
    return acls


def principals(tenants: list[str]) -> list[str]:
    """Every SCRAM user a stack needs (deploy/kafka/kafka.sh creates the same list)."""
    return ["admin", *t.ALL_SERVICES, OPERATOR, ANALYTICS, *[tenant_principal(tenant) for tenant in tenants]]


def tenant_topics(tenant: str) -> list[tuple[str, t.TopicSpec]]:
    """The topics an operator creates for a tenant (names relative to the namespace)."""
    return [
        (tenancy.request_topic(tenant), t.BY_NAME[t.REQUESTS]),
        (tenancy.tenant_reply_topic(tenant), t.REPLIES_SPEC),
        (tenancy.feedback_topic(tenant), t.FEEDBACK_TENANT_SPEC),
    ]
