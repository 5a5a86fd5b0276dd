"""Redis key names that more than one program builds: a service and the CLI that cleans up after it,
and the Redis ACLs (llmbus.security.redis_acls) that grant each service exactly its keys.

A key family whose scripts touch many of its keys at once carries one hash tag (`{…}`), so on a Redis
Cluster all of them live in one slot and every script runs on one node; the names are the same with
or without a cluster.
"""

from __future__ import annotations


def cost_key_root(topic_prefix: str) -> str:
    """Cost-accounting's keys (markers, outbox, held results, totals, leases): `{<prefix>cost}:<kind>:…`.

    One tag for all of them: a billing script marks hundreds of records and adds to their totals at once."""
    return "{" + topic_prefix + "cost}:"


def legacy_cost_key_root(topic_prefix: str) -> str:
    """Where cost-accounting's keys were before they carried a hash tag (read once, to move them)."""
    return f"{topic_prefix}cost:"


def coalesce_key_root(router_namespace: str) -> str:
    """The router's request coalescing (`router_namespace`: `<prefix>router`): `llmbus:{<prefix>router:
    coalesce}:<kind>:…`, one tag (a join touches the lead, the follower's parked request, the leader's
    followers and the shared sweep set)."""
    return "llmbus:{" + router_namespace + ":coalesce}:"


def legacy_coalesce_key_root(router_namespace: str) -> str:
    """Where coalescing kept its keys before the hash tag (followers parked there are still swept)."""
    return f"llmbus:{router_namespace}:coalesce:"


def experiment_key_root(topic_prefix: str) -> str:
    """Experiment versions (llmbus.state.experiment_versions): `llmbus:<prefix>experiments:<id>`."""
    return f"llmbus:{topic_prefix}experiments:"


def glob_literal(text: str) -> str:
    """`text` as a literal in a Redis glob pattern (SCAN MATCH, ACL key patterns)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
