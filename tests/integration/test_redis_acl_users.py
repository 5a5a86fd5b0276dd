"""Per-service Redis ACL users (llmbus.security.redis_acls) on a private Redis started by
deploy/redis/redis.sh with the generated ACL file.

Every container used to get the same full-rights password: any compromised one could write
`apikey:<hash>` and mint an API key for any tenant. Now each service logs in as its own user, reaches
only its own keys with the commands its stores send, and the services' real handlers and stores work
under those users; the archive (and the autoscaler) have no Redis user at all.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as redis
import redis.exceptions
from pydantic import SecretStr

from llmbus.bus.memory import MemoryBus
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import CostRecord, Experiment, InferenceRequest, InferenceResult, ResultStatus
from llmbus.domain.lifecycle import create, next_version
from llmbus.security import redis_acls
from llmbus.security.acls import OPERATOR
from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.settings import BusSettings
from llmbus.state.experiment_versions import ExperimentVersions
from llmbus.state.keys import cost_key_root
from llmbus.state.store import dispatch_markers, redis_client
from llmbus_services.cost_accounting.app import CostService
from llmbus_services.cost_accounting.config import CostSettings
from llmbus_services.router.adapters.limits import LIMITER_ERRORS, RedisRateLimiter
from llmbus_services.router.app import build_core
from llmbus_services.router.core.config import TenantPolicy, load_policy
from llmbus_services.scheduler.adapters.store import PlacementStore
from llmbus_services.shadow_comparator.app import build as build_comparator
from llmbus_services.shadow_comparator.config import ComparatorSettings
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.service_procs import REPO
from tests.integration.test_cost_handlers import hosted, send_result
from tests.integration.test_placement_store_redis import placement

pytestmark = pytest.mark.redis

PREFIX = "acl."
PRINCIPALS = [t.ROUTER, t.SCHEDULER, t.WORKER, t.COST, t.COMPARATOR, t.GATEWAY, t.AUTOSCALER, t.ARCHIVE, OPERATOR]
PASSWORDS = {user: secrets.token_urlsafe(16) for user in [*PRINCIPALS, "admin"]}


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    run_dir: Path = tmp_path_factory.mktemp("redis-acl")
    acl_file = run_dir / "users.acl"
    acl_file.write_text(redis_acls.acl_file(PREFIX, PASSWORDS, PASSWORDS["admin"]))
    port = free_port()
    env = os.environ | {
        "REDIS_PORT": str(port),
        "REDIS_RUN_DIR": str(run_dir),
        "REDIS_NAME": "redis-acl",
        "REDIS_APPENDONLY": "no",
        "REDIS_ACLFILE": str(acl_file),
        "REDIS_PASSWORD": PASSWORDS["admin"],  # `default`: what the script's own redis-cli calls use
    }
    script = str(REPO / "deploy/redis/redis.sh")
    try:
        subprocess.run([script, "start"], env=env, check=True, timeout=60)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        subprocess.run([script, "stop"], env=env, check=False, timeout=30)


def settings_of(url: str, user: str) -> BusSettings:
    """A service's settings: its Redis user and password (LLMBUS_REDIS_USERNAME, LLMBUS_REDIS_PASSWORD)."""
    return BusSettings(
        topic_prefix=PREFIX,
        redis_url=url,
        redis_username=user,
        redis_password=SecretStr(PASSWORDS[user]),
        log_json=False,
    )


def client_of(url: str, user: str) -> redis.Redis:
    settings = settings_of(url, user)
    return redis_client(settings.redis_url, max_connections=4, password=settings.redis_password)


async def test_the_router_cannot_mint_an_api_key_and_the_gateway_can_only_read_one(acl_redis: str) -> None:
    operator, gateway, router = (client_of(acl_redis, u) for u in (OPERATOR, t.GATEWAY, t.ROUTER))
    namespace = gateway_key_namespace(PREFIX)
    try:
        secret, key = await ApiKeyStore(operator, namespace).create("acme")  # `llmbus keys create`
        assert await ApiKeyStore(gateway, namespace).lookup(secret) == key
        with pytest.raises(redis.exceptions.NoPermissionError):
            await ApiKeyStore(gateway, namespace).create("acme")
        minted = f"llmbus:{namespace}:apikey:{'0' * 64}"
        forged = '{"key_id": "key-x", "tenant": "acme"}'
        for client in (router, gateway):
            with pytest.raises(redis.exceptions.NoPermissionError):
                await client.set(minted, forged)
        with pytest.raises(redis.exceptions.NoPermissionError):  # nor through a script: Redis checks inside it
            await router.eval("return redis.call('SET', KEYS[1], ARGV[1])", 1, minted, forged)
        with pytest.raises(redis.exceptions.NoPermissionError):
            await router.keys("*")  # no dangerous command either
        assert await operator.exists(minted) == 0
    finally:
        for client in (operator, gateway, router):
            await client.aclose()


@pytest.mark.parametrize("user", [t.ARCHIVE, t.AUTOSCALER, "nobody"])
async def test_the_archive_and_the_autoscaler_have_no_redis_user(acl_redis: str, user: str) -> None:
    client = redis_client(f"redis://{user}@{acl_redis.removeprefix('redis://')}", password=SecretStr("any"))
    with pytest.raises(redis.exceptions.AuthenticationError):
        await client.ping()
    await client.aclose()
    anonymous = redis_client(acl_redis)  # `default` needs its own password
    with pytest.raises(redis.exceptions.AuthenticationError):
        await anonymous.ping()
    await anonymous.aclose()


async def test_the_router_scheduler_and_workers_stores_work_under_their_own_users(acl_redis: str) -> None:
    settings = settings_of(acl_redis, t.ROUTER)
    core, _, cache, coalescer, _ = build_core(
        load_policy(), f"{PREFIX}router", settings.redis_url, settings.redis_password
    )
    router_markers = dispatch_markers(client_of(acl_redis, t.ROUTER), PREFIX, 3600)
    scheduler = client_of(acl_redis, t.SCHEDULER)
    worker_markers = dispatch_markers(client_of(acl_redis, t.WORKER), PREFIX, 3600)
    try:
        ask = InferenceRequest(request_id="r1", tenant="acme", prompt="what is kafka?", max_tokens=8, temperature=0.0)
        outcome = await core.route(ask, 0)  # rate limits, the exact cache's lookup, coalescing's join
        assert outcome.routed is not None
        again = await core.route(ask.model_copy(update={"request_id": "r2"}), 0)  # follows r1 (coalesced)
        assert again.routed is None or again.routed.request_id == "r2"
        assert coalescer is not None and await coalescer.finish(ask.request_key) is not None
        done = InferenceResult(
            request_id="r1", tenant="acme", status=ResultStatus.OK, model=outcome.routed.model, text="x"
        )
        await cache.complete(done.model_copy(update={"route_reason": outcome.routed.route_reason}))
        assert await router_markers.claim_final("acme:r9", 0)

        store = PlacementStore(scheduler, f"{PREFIX}scheduler", "s1")
        assert await store.claim(placement("r3"))
        assert [p.request_id for p in await store.load(16, 512)] == ["r3"]
        await store.release(placement("r3").request_key, 1)

        assert await worker_markers.claim_final("acme:r3", 1)
        await worker_markers.final_published("acme:r3", 1)
        assert await worker_markers.superseded("acme:r3", 2)
    finally:
        await cache.close()
        for client in (router_markers, worker_markers):
            await client._client.aclose()
        await scheduler.aclose()


async def test_the_routers_rate_limits_decide_under_its_user(acl_redis: str) -> None:
    """The limits' script reads Redis's clock (TIME): refused it, every check would fail open (and let
    every request through) instead of holding a tenant to its burst."""
    router = client_of(acl_redis, t.ROUTER)
    limiter = RedisRateLimiter(router, f"{PREFIX}router")
    failed_open = LIMITER_ERRORS._value.get()
    try:
        limits = TenantPolicy(requests_per_s=0.1, burst_requests=1)
        assert (await limiter.take("acme", limits, 1)).allowed
        refused = await limiter.take("acme", limits, 1)
        assert (refused.allowed, refused.limit) == (False, "requests")
        assert LIMITER_ERRORS._value.get() == failed_open
    finally:
        await router.aclose()


async def test_cost_accountings_handlers_bill_under_their_own_user(acl_redis: str) -> None:
    settings = settings_of(acl_redis, t.COST)
    bus = MemoryBus(settings)
    svc = CostService(settings, CostSettings(interval_s=60, grace_s=1, settle_s=0), bus.runtime(contracts.COST))
    billed = bus.spy(svc.topics.name(t.COSTS), CostRecord)
    operator = client_of(acl_redis, OPERATOR)
    try:
        await svc.handlers.restore()
        await send_result(svc, bus, hosted("c1"))
        await send_result(svc, bus, hosted("c1"))  # once
        assert [c.request_id for c in billed] == ["c1"]
        assert await operator.exists(f"{cost_key_root(PREFIX)}applied:{billed[0].record_id}")  # `llmbus costs`, gc
    finally:
        await svc.redis.aclose()
        await operator.aclose()


async def test_the_comparators_handlers_and_experiment_versions_work_under_its_user(acl_redis: str) -> None:
    settings = settings_of(acl_redis, t.COMPARATOR)
    bus = MemoryBus(settings)
    handlers = build_comparator(bus.runtime(contracts.COMPARATOR), ComparatorSettings(decide=False))
    operator_versions = ExperimentVersions(client_of(acl_redis, OPERATOR), PREFIX)
    try:
        experiment = next_version(Experiment(experiment_id="e1", kind="shadow"), create("e1", "m1", "m2"))
        assert (await operator_versions.compare_and_set(0, experiment))[0]  # `llmbus experiments create`
        handlers.comparator.experiments.apply(experiment)
        result = InferenceResult(
            request_id="p1", tenant="acme", status=ResultStatus.OK, model="m1", experiment_id="e1", variant="control"
        )
        await handlers.on_result(result)
        assert await handlers.comparator.store.lead("c1", 30)
        later = next_version(experiment, experiment)
        assert (await handlers.versions.compare_and_set(experiment.version, later))[0]
    finally:
        await handlers.comparator.store.close()
        await operator_versions._client.aclose()
