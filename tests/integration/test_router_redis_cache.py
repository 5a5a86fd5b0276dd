"""The exact response cache on the real Redis: filled from results, scoped per tenant, with TTL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from llmbus.contract.messages import (
    ErrorCode,
    ErrorInfo,
    FinishReason,
    FunctionCall,
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    ToolCall,
    Usage,
)
from llmbus_services.router.adapters.cache import RedisResponseCache
from llmbus_services.router.core.cache_key import cache_key
from llmbus_services.router.core.complexity import build_scorer
from llmbus_services.router.core.config import load_policy
from llmbus_services.router.core.pipeline import RouterCore
from tests.support import redis_keys

pytestmark = pytest.mark.redis


@pytest.fixture
async def cache(client: redis.Redis) -> AsyncIterator[RedisResponseCache]:
    namespace = f"test-router-{uuid.uuid4().hex[:10]}"
    yield RedisResponseCache(client, namespace, ttl_s=60, pending_ttl_s=60)
    keys = await redis_keys(client, f"llmbus:{namespace}:*")
    if keys:
        await client.delete(*keys)


def ok_result(request_id: str, tenant: str, text: str = "4") -> InferenceResult:
    return InferenceResult(
        request_id=request_id,
        tenant=tenant,
        status=ResultStatus.OK,
        model="m",
        text=text,
        usage=Usage(prompt_tokens=5, completion_tokens=1),
    )


async def test_result_fills_the_cache_and_hits_only_the_same_tenant(cache: RedisResponseCache) -> None:
    core = RouterCore(load_policy(), build_scorer("heuristic"), cache=cache)
    ask = InferenceRequest(request_id="r1", prompt="2+2?", temperature=0.0, tenant="acme")
    first = await core.route(ask)
    assert first.routed is not None
    assert await cache.complete(ok_result("r1", "acme"))
    assert not await cache.complete(ok_result("r1", "acme"))  # the pending mark is consumed once

    hit = await core.route(ask.model_copy(update={"request_id": "r2"}))
    assert hit.result is not None and hit.result.cached and hit.result.text == "4"
    assert hit.result.usage.prompt_tokens == 5 and hit.result.request_id == "r2"

    other = await core.route(ask.model_copy(update={"request_id": "r3", "tenant": "globex"}))
    assert other.routed is not None and other.result is None


async def test_failed_shadow_and_foreign_results_are_not_stored(cache: RedisResponseCache) -> None:
    request = InferenceRequest(prompt="q", temperature=0.0, tenant="acme")
    key = cache_key(request, "m")
    for rid in ("e", "s", "x"):
        assert await cache.lookup(key, pending_id=f"acme:{rid}") is None  # marks are by request key
    failed = InferenceResult(
        request_id="e", tenant="acme", status=ResultStatus.ERROR, error=ErrorInfo.of(ErrorCode.ENGINE_FAILED, "boom")
    )
    assert not await cache.complete(failed)
    assert not await cache.complete(ok_result("s", "acme").model_copy(update={"shadow": True}))
    assert not await cache.complete(ok_result("x", "globex"))  # tenant differs from the key's tenant
    assert not await cache.complete(ok_result("never-routed", "acme"))
    assert await cache.lookup(key) is None


async def test_entries_expire(client: redis.Redis, cache: RedisResponseCache) -> None:
    request = InferenceRequest(prompt="q", temperature=0.0, tenant="acme")
    key = cache_key(request, "m")
    assert await cache.lookup(key, pending_id="acme:r") is None
    assert await cache.complete(ok_result("r", "acme"))
    ttl_s = await client.ttl(f"llmbus:{cache._namespace}:cache:{key}")
    assert 0 < ttl_s <= 60
    answer = await cache.lookup(key)
    assert answer is not None and answer.text == "4" and answer.model == "m"


async def test_a_lookup_marks_only_a_miss_pending(client: redis.Redis, cache: RedisResponseCache) -> None:
    """A miss is marked pending (its result fills the entry), a hit is not."""
    key = cache_key(InferenceRequest(prompt="q", temperature=0.0, tenant="acme"), "m")
    assert await cache.lookup(key, pending_id="acme:first") is None
    assert await client.ttl(f"llmbus:{cache._namespace}:cache-pending:acme:first") > 0
    assert await cache.complete(ok_result("first", "acme"))
    hit = await cache.lookup(key, pending_id="acme:second")
    assert hit is not None and hit.text == "4"
    assert await client.exists(f"llmbus:{cache._namespace}:cache-pending:acme:second") == 0


async def test_an_answer_of_tool_calls_is_not_cached(cache: RedisResponseCache) -> None:
    core = RouterCore(load_policy(), build_scorer("heuristic"), cache=cache)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    ask = InferenceRequest(request_id="t1", prompt="look it up", temperature=0.0, tenant="acme", tools=tools)
    assert (await core.route(ask)).routed is not None
    called = ok_result("t1", "acme", text="").model_copy(
        update={
            "finish_reason": FinishReason.TOOL_CALLS,
            "tool_calls": [ToolCall(id="c1", function=FunctionCall(name="lookup", arguments="{}"))],
        }
    )
    assert not await cache.complete(called)
    again = await core.route(ask.model_copy(update={"request_id": "t2"}))
    assert again.routed is not None and again.result is None  # generated again, not answered with ""
