"""API keys, cost-accounting's store, request coalescing and experiment versions on a real 3-master
Redis Cluster (tests/fixtures/redis_cluster.py), through the client the services use with
LLMBUS_REDIS_CLUSTER=true.

Keys could not be created or revoked there (one MULTI over two slots), and cost-accounting's and
coalescing's scripts built their keys inside Lua (keys of many slots that the script was not given).
"""

from __future__ import annotations

import pytest
import redis.asyncio as redis

from llmbus.contract.messages import (
    CostKind,
    CostRecord,
    Experiment,
    ExperimentState,
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    RoutedRequest,
    now_ms,
)
from llmbus.contract.request_key import request_key
from llmbus.domain.lifecycle import create, next_version, with_state
from llmbus.security.apikeys import ApiKeyStore
from llmbus.state.experiment_versions import ExperimentVersions
from llmbus_services.cost_accounting.adapters.store import CostStore
from llmbus_services.cost_accounting.core.aggregates import agg_key
from llmbus_services.cost_accounting.core.costing import ServedRequest
from llmbus_services.router.adapters.coalescing import RedisCoalescer

pytestmark = pytest.mark.redis


async def test_api_keys_are_created_listed_exported_revoked_and_restored_on_a_cluster(
    cluster: redis.Redis, cluster_prefix: str
) -> None:
    prefix = cluster_prefix
    keys = ApiKeyStore(cluster, f"{prefix}gateway")
    secret, created = await keys.create("acme", "ci")
    other_secret, other = await keys.create("globex")
    assert (await keys.lookup(secret)) == created and (await keys.lookup(other_secret)) == other
    assert [k.key_id for k in await keys.list()] == [created.key_id, other.key_id]
    exported = await keys.export()
    assert {k.key_id for k in exported} == {created.key_id, other.key_id}
    assert await keys.revoke(created.key_id) and await keys.lookup(secret) is None
    assert not await keys.revoke(created.key_id)
    assert await keys.restore(exported) == 1 and (await keys.lookup(secret)) == created


def _result(request_id: str, tenant: str = "acme") -> InferenceResult:
    return InferenceResult(
        request_id=request_id, tenant=tenant, status=ResultStatus.OK, model="m", worker_id="w1", text="ok"
    )


def _served(result: InferenceResult) -> ServedRequest:
    """`result` waiting for its worker's GPU intervals, whole (not a leg of a continued answer)."""
    return ServedRequest(result, "pool", "w1", start_ms=0, end_ms=1, prefill_tokens=0, decode_tokens=0)


def _record(request_id: str, tenant: str = "acme", micro_usd: int = 1000) -> CostRecord:
    return CostRecord(
        request_id=request_id,
        tenant=tenant,
        model="m",
        cost_usd=micro_usd / 1e6,
        cost_micro_usd=micro_usd,
        prompt_tokens=10,
        completion_tokens=5,
        record_id=f"{tenant}:{request_id}:hosted",
        kind=CostKind.HOSTED,
        booked_at_ms=now_ms(),
    )


async def test_cost_accountings_store_bills_each_record_once_on_a_cluster(
    cluster: redis.Redis, cluster_prefix: str
) -> None:
    prefix = cluster_prefix
    store = CostStore(cluster, prefix, dedupe_ttl_s=3600)
    assert await store.state_id() is None
    state, _ = await store.mark_state()
    assert await store.state_id() == state

    held = [_result(f"r{i}") for i in range(3)]
    assert await store.seen(held) == [False] * 3
    await store.hold([(_served(r), r.to_bytes()) for r in held])
    assert await store.seen(held) == [True] * 3
    assert await store.still_held([("w1", r.request_key) for r in held]) == [True] * 3
    assert await store.held_ids(["w1"]) == {"w1": {r.request_key for r in held}}
    assert len(await store.held_results("w1", [held[0].request_key])) == 1
    assert await store.lease(["w1", "w2"], "replica-a", 10_000) == {"w1", "w2"}
    assert await store.lease(["w1"], "replica-b", 10_000) == set()

    records = [_record(f"r{i}") for i in range(3)] + [_record("r9", "globex", 5000)]
    staged = await store.stage(records, [r.to_bytes() for r in records])
    assert len(staged) == 4 and len(await store.staged()) == 4
    assert await store.bill(records) == [True] * 4
    assert await store.bill(records) == [False] * 4  # once, by record id
    assert await store.staged() == []
    assert await store.applied([r.record_id for r in records]) == [True] * 4
    assert await store.bill_one_by_one([_record("r10")]) == [True]
    at_ms = records[0].booked_at_ms
    tenants = agg_key(store.ns, "month", at_ms, "tenant")
    assert await store.tenant_spent([(tenants, "acme"), (tenants, "globex")]) == [4000, 5000]
    assert (await store.totals(agg_key(store.ns, "day", at_ms, "total")))["all|cost"] == 9000
    assert await store.apply_once("scale:p:1", [(agg_key(store.ns, "day", at_ms, "pool"), "p|scale_ups", 1)])
    assert not await store.apply_once("scale:p:1", [(agg_key(store.ns, "day", at_ms, "pool"), "p|scale_ups", 1)])

    # The GPU ledger's records of the held results: a whole result's record id is its request key.
    ledger = {"kind": CostKind.SELF_HOSTED, "worker_id": "w1"}
    priced = [r.model_copy(update=ledger | {"record_id": request_key(r.tenant, r.request_id)}) for r in records[:3]]
    await store.release(priced, {"w1": {"closed_ms": 1}})  # type: ignore[dict-item]
    assert await store.still_held([("w1", r.request_key) for r in held]) == [False] * 3
    assert await store.cursor("w1") == {"closed_ms": 1}
    assert await store.load_held() == ([], {"w1": {"closed_ms": 1}})
    await store.restore_billed([_record("r20")])
    assert await store.applied(["acme:r20:hosted"]) == [True]
    assert await store.first_alert("acme", "m202501", 80) and not await store.first_alert("acme", "m202501", 80)


async def test_request_coalescing_joins_finishes_and_sweeps_on_a_cluster(
    cluster: redis.Redis, cluster_prefix: str
) -> None:
    prefix = cluster_prefix
    coalescer = RedisCoalescer(cluster, f"{prefix}router", lead_ttl_s=60, max_wait_s=60)

    def routed(request_id: str) -> RoutedRequest:
        return RoutedRequest(request=InferenceRequest(request_id=request_id, prompt="same", max_tokens=4), model="m")

    assert await coalescer.join("k1", routed("lead")) is None  # it leads
    leader = request_key("default", "lead")
    assert await coalescer.join("k1", routed("f1")) == leader
    assert await coalescer.join("k1", routed("f2")) == leader
    followers = await coalescer.finish(leader)
    assert followers == [request_key("default", "f1"), request_key("default", "f2")]
    claimed = await coalescer.claim(followers[0])
    assert claimed is not None and claimed.request_id == "f1"
    assert await coalescer.claim(followers[0]) is None  # claimed once
    await coalescer.done(followers[0])
    assert await coalescer.join("k1", routed("next")) is None  # the lead ended with its finish
    assert await coalescer.overdue() == []


async def test_experiment_versions_compare_and_set_on_a_cluster(cluster: redis.Redis, cluster_prefix: str) -> None:
    prefix = cluster_prefix
    versions = ExperimentVersions(cluster, prefix)
    v1 = next_version(Experiment(experiment_id="e", kind="shadow"), create("e", "m1", "m2"))
    assert await versions.compare_and_set(0, v1) == (True, v1)
    stopped = next_version(v1, with_state(v1, ExperimentState.STOPPED))
    assert (await versions.compare_and_set(1, stopped))[0]
    late, current = await versions.compare_and_set(1, next_version(v1, v1))
    assert not late and current is not None and current.state == ExperimentState.STOPPED
    assert (await versions.latest("e")) == stopped
