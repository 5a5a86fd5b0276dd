"""A request's identity wherever state is kept by request: its tenant and its request id together.

Request ids are the client's to choose (the README's own example is `r-1`), so two tenants may send
the same one. Every key of state held per request (final markers and fences, the scheduler's queue
and placements, the router's pending cache marks, a worker's running attempts, cost-accounting's seen
markers, held results and record ids) is built from this, so each (tenant, request id) gets its own
one result. What a tenant sees is unchanged: messages carry `request_id` as the tenant sent it.
"""

from __future__ import annotations

from typing import NewType

RequestKey = NewType("RequestKey", str)


def request_key(tenant: str, request_id: str) -> RequestKey:
    """`<tenant>:<request id>`. A tenant name has no ':' (its pattern is `[A-Za-z0-9_.-]+`), so the
    first ':' ends it and no two (tenant, request id) pairs share a key."""
    return RequestKey(f"{tenant}:{request_id}")


def request_id_of(key: RequestKey) -> str:
    """The request id inside `key`, as the tenant sent it (what records are keyed by on the bus)."""
    return key.split(":", 1)[1]
