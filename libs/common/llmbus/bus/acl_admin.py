"""Apply ACLs (llmbus.security.acls) to the broker: CreateAcls through aiokafka's admin, every call bounded.

Creating an ACL that exists is a no-op on the broker, so `apply_acls` is idempotent. The
caller must be allowed to alter ACLs (the broker's super user, `admin`).
"""

from __future__ import annotations

import asyncio

from aiokafka.errors import IncompatibleBrokerVersion, for_code
from aiokafka.protocol.admin import CreateAclsRequest, CreateAclsRequestStruct

from llmbus.bus.admin import open_admin
from llmbus.security.acls import Acl
from llmbus.settings import BusSettings

# Kafka's wire codes (org.apache.kafka.common.acl / resource).
_RESOURCE = {"topic": 2, "group": 3}
_PATTERN = {"literal": 3, "prefixed": 4}
_OPERATION = {"read": 3, "write": 4, "create": 5, "describe": 8}
_ALLOW = 3


class _CreateAcls(CreateAclsRequest):
    """Many ACLs in one CreateAcls request (aiokafka's builds one per request)."""

    def __init__(self, acls: list[Acl]) -> None:
        self._creations = [
            (
                _RESOURCE[a.resource_type],
                a.name,
                _PATTERN[a.pattern],
                f"User:{a.principal}",
                "*",
                _OPERATION[a.operation],
            )
            for a in acls
        ]

    def build(self, request_struct_class: type[CreateAclsRequestStruct]) -> CreateAclsRequestStruct:
        if request_struct_class.API_VERSION < 1:
            raise IncompatibleBrokerVersion("CreateAcls v1 (pattern types) is needed")
        return request_struct_class([(*creation, _ALLOW) for creation in self._creations])


async def apply_acls(settings: BusSettings, acls: list[Acl], batch: int = 200) -> int:
    """Create every ACL, `batch` per request, each request bounded by admin_timeout_s; returns how many."""
    async with open_admin(settings) as admin:
        node_id = next(iter(admin._client.cluster.brokers())).nodeId
        for start in range(0, len(acls), batch):
            chunk = acls[start : start + batch]
            # aiokafka has no public ACL call; the admin's request to a node is public enough to rely on.
            response = await asyncio.wait_for(
                admin._send_request_to_node(node_id, _CreateAcls(chunk)), settings.admin_timeout_s
            )
            for acl, (code, message) in zip(chunk, response.creation_responses, strict=True):
                if code:
                    raise for_code(code)(f"creating ACL {acl.render()}: {message}")
    return len(acls)
