"""Who a request belongs to and where its answer may go: pure policy, no broker imports.

With auth on (SASL), Kafka does not stamp the writer's identity on a record, so identity
follows from where a record may be written: `llm.requests.<tenant>` and `llm.feedback.<tenant>`
only that tenant may write (ACLs, llmbus.security.acls), and the shared `llm.requests` and `llm.feedback`
only the gateway, which knows the API key. A tenant's replies live in its own namespace,
`llm.replies.<tenant>[.<suffix>]`, which only it may read.

Without auth (dev), the shared `llm.tokens` and any existing client reply topic in the
allowed prefix are accepted, but never an internal topic of the catalog: chunks written
there would corrupt it (a worker's dispatch topic, llm.results, the compacted llm.workers).

Names here are relative to the namespace prefix (what a request names), like the catalog's.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

from llmbus.contract import topics as t

# A tenant name that can be part of a topic name and an ACL prefix: no dots, so the prefix ACL
# `llm.replies.<tenant>.` of one tenant never covers another tenant's topics.
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
TENANT_REQUESTS_PREFIX = t.REQUESTS + "."
TENANT_FEEDBACK_PREFIX = t.FEEDBACK + "."
# Gateway instances name their reply topics in the same namespace (llm.replies.<instance>);
# a tenant may not take a name a gateway instance uses.
RESERVED_TENANT_PREFIXES = ("gw-",)
TENANT_PRINCIPAL_PREFIX = "tenant-"  # a tenant's Kafka principal (SCRAM user): tenant-<name>


@dataclass(frozen=True)
class Source:
    """Where a request came from: the authenticated tenant, or a trusted service (the gateway)."""

    tenant: str | None  # None: the shared llm.requests (dev mode, or the gateway when auth is on)

    @property
    def trusted(self) -> bool:
        return self.tenant is None


class Refused(Exception):
    """A request the security policy refuses; `reason` is what the caller is told."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def tenant_name_problem(tenant: str) -> str | None:
    if not TENANT_NAME.match(tenant):
        return f"tenant {tenant!r} is not a valid tenant name (letters, digits, '_' and '-', at most 64)"
    if tenant.startswith(RESERVED_TENANT_PREFIXES):
        return f"tenant {tenant!r} uses a prefix reserved for gateway instances {RESERVED_TENANT_PREFIXES}"
    return None


def request_topic(tenant: str) -> str:
    """A tenant's own request topic (relative to the namespace)."""
    return TENANT_REQUESTS_PREFIX + tenant


def feedback_topic(tenant: str) -> str:
    """A tenant's own feedback topic (relative to the namespace)."""
    return TENANT_FEEDBACK_PREFIX + tenant


def _source_in(topic_base: str, shared: str, what: str) -> Source:
    if topic_base == shared:
        return Source(None)
    if not topic_base.startswith(shared + "."):
        raise Refused(f"{topic_base!r} is not a {what} topic")
    tenant = topic_base.removeprefix(shared + ".")
    if problem := tenant_name_problem(tenant):
        raise Refused(problem)
    return Source(tenant)


def source_of(request_topic_base: str) -> Source:
    """The source of a record read from `request_topic_base` (the topic name without the namespace)."""
    return _source_in(request_topic_base, t.REQUESTS, "request")


def feedback_source_of(feedback_topic_base: str) -> Source:
    """The source of a feedback record read from `feedback_topic_base` (without the namespace)."""
    return _source_in(feedback_topic_base, t.FEEDBACK, "feedback")


def _tenant_topic_pattern(prefix: str, shared: str) -> str:
    return rf"^{re.escape(prefix + shared)}(\.[A-Za-z0-9][A-Za-z0-9_-]{{0,63}})?$"


def request_topic_pattern(prefix: str) -> str:
    """What the router subscribes to when auth is on: the gateway's shared topic and every tenant's."""
    return _tenant_topic_pattern(prefix, t.REQUESTS)


def feedback_topic_pattern(prefix: str) -> str:
    """What feedback readers subscribe to when auth is on: the gateway's shared topic and every tenant's."""
    return _tenant_topic_pattern(prefix, t.FEEDBACK)


def tenant_of_principal(username: str | None) -> str | None:
    """The tenant a Kafka principal speaks for; None for services and operators."""
    if username is None or not username.startswith(TENANT_PRINCIPAL_PREFIX):
        return None
    return username.removeprefix(TENANT_PRINCIPAL_PREFIX)


def default_reply_topic(auth: bool, tenant: str) -> str:
    """Where a tenant's answers go when its request names nothing usable (errors included)."""
    return tenant_reply_topic(tenant) if auth else t.TOKENS


def tenant_reply_topic(tenant: str) -> str:
    return t.REPLIES_PREFIX + tenant


def check_tenant(source: Source, claimed_tenant: str, what: str = "request") -> str:
    """The tenant a record is taken as: the authenticated one; a body claiming another is refused.

    `what` names the kind of topic in the refusal ("request", "feedback")."""
    if source.tenant is None:
        return claimed_tenant
    if claimed_tenant != source.tenant:
        raise Refused(
            f"{what} claims tenant {claimed_tenant!r} but was written to the {what} topic of {source.tenant!r}"
        )
    return source.tenant


def is_internal(topic: str) -> bool:
    """A topic of the catalog that is not a client's reply topic, or one named per worker / tenant."""
    if topic.startswith((t.DISPATCH_PREFIX, TENANT_REQUESTS_PREFIX, TENANT_FEEDBACK_PREFIX)):
        return True
    return topic in t.BY_NAME and topic != t.TOKENS


def reply_topic_problem(
    reply_topic: str, source: Source, *, auth: bool, exists: bool, allowed_prefix: str = "llm."
) -> str | None:
    """Why `reply_topic` may not receive the answer of a request from `source`; None: it may.

    Checked before anything is published, so a refused request costs no write to the named
    topic (and no metadata wait for a topic that does not exist).
    """
    if is_internal(reply_topic):
        return f"reply_topic {reply_topic!r} is an internal topic"
    if auth:
        if source.tenant is None:  # the gateway: its instance topics, or any tenant's namespace
            if not reply_topic.startswith(t.REPLIES_PREFIX):
                return f"reply_topic {reply_topic!r} is outside {t.REPLIES_PREFIX}*"
        else:
            own = tenant_reply_topic(source.tenant)
            if reply_topic != own and not reply_topic.startswith(own + "."):
                return f"reply_topic {reply_topic!r} is outside the tenant's namespace {own}[.<suffix>]"
    elif not reply_topic.startswith(allowed_prefix):
        return f"reply_topic {reply_topic!r} must start with {allowed_prefix!r}"
    if not exists:
        return f"reply_topic {reply_topic!r} does not exist (an operator creates it: llmbus acl apply)"
    return None


def user_ref(user_id: str | None, *, hashed: bool, salt: str) -> str | None:
    """The user id as results and costs carry it: HMAC-SHA256 (hex) under the deployment's salt where
    the tenant asks (the same user maps to the same value, so per-user metrics still work), else as given."""
    if user_id is None or not hashed:
        return user_id
    if not salt:
        raise ValueError("hashing user ids needs a salt (LLMBUS_ROUTER_USER_ID_SALT): without one it is reversible")
    return hmac.new(salt.encode(), user_id.encode(), hashlib.sha256).hexdigest()
