"""The semantic cache on the real Redis (embedder faked): filled from results, per tenant and model, bounded."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest
import redis.asyncio as redis

from llmbus.contract.messages import InferenceRequest, InferenceResult, ResultStatus, Usage
from llmbus_services.router.adapters.cache import RedisResponseCache
from llmbus_services.router.adapters.semantic_cache import RedisSemanticCache
from llmbus_services.router.core.cache_key import cache_key
from llmbus_services.router.core.config import SemanticCachePolicy
from llmbus_services.router.core.semantic import normalised

pytestmark = pytest.mark.redis
MODEL = "m"


class TableEmbedder:
    """Texts with the same first word embed alike (a stand-in for 'paraphrases')."""

    name = "table"

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        rows = []
        for text in texts:
            head = text.split()[0]
            seed = int.from_bytes(head.encode()[:4].ljust(4, b"\0"), "little")
            base = np.random.default_rng(seed).normal(size=16)
            tail = np.random.default_rng(len(text)).normal(size=16) * 0.05  # small difference
            rows.append(base + tail)
        return normalised(np.array(rows, dtype=np.float32))


def caches(client: redis.Redis, namespace: str, **policy: object) -> tuple[RedisResponseCache, RedisSemanticCache]:
    exact = RedisResponseCache(client, namespace, ttl_s=60, pending_ttl_s=60)
    semantic = RedisSemanticCache(
        client,
        namespace,
        TableEmbedder(),
        SemanticCachePolicy(enabled=True, threshold=0.9, **policy),
        exact,  # type: ignore[arg-type]
    )
    return exact, semantic


async def answer(exact: RedisResponseCache, semantic: RedisSemanticCache, request: InferenceRequest) -> None:
    """Route-time marks, then the result: what the router does for a miss that gets answered."""
    key = cache_key(request, MODEL)
    probe = await semantic.lookup(request, MODEL)
    assert probe.answer is None
    assert await exact.lookup(key, pending_id=request.request_key) is None
    await semantic.remember_pending(request.request_key, key, request.tenant, MODEL, probe.vector)
    result = InferenceResult(
        request_id=request.request_id,
        tenant=request.tenant,
        status=ResultStatus.OK,
        model=MODEL,
        text=f"answer to {request.prompt}",
        usage=Usage(prompt_tokens=3, completion_tokens=4),
    )
    assert await exact.complete(result)
    assert await semantic.complete(result)


def ask(request_id: str, prompt: str, tenant: str = "acme") -> InferenceRequest:
    return InferenceRequest(request_id=request_id, prompt=prompt, tenant=tenant, temperature=0.0)


async def test_a_similar_prompt_hits_only_within_its_tenant(client: redis.Redis, namespace: str) -> None:
    exact, semantic = caches(client, namespace)
    await answer(exact, semantic, ask("r1", "kafka what is it"))
    hit = await semantic.lookup(ask("r2", "kafka what is it, please"), MODEL)
    assert hit.answer is not None and hit.answer.text == "answer to kafka what is it" and hit.similarity >= 0.9
    assert (await semantic.lookup(ask("r3", "kafka what is it", tenant="globex"), MODEL)).answer is None
    assert (await semantic.lookup(ask("r4", "kafka what is it"), "other-model")).answer is None
    assert (await semantic.lookup(ask("r5", "bread how to bake"), MODEL)).answer is None


async def test_failed_or_foreign_results_are_not_indexed(client: redis.Redis, namespace: str) -> None:
    _, semantic = caches(client, namespace)
    request = ask("r1", "kafka what is it")
    probe = await semantic.lookup(request, MODEL)
    await semantic.remember_pending(request.request_key, cache_key(request, MODEL), "acme", MODEL, probe.vector)
    foreign = InferenceResult(request_id="r1", tenant="globex", status=ResultStatus.OK, text="x")
    assert not await semantic.complete(foreign)  # the pending mark is the request's tenant's
    assert not await semantic.complete(InferenceResult(request_id="r9", tenant="acme", status=ResultStatus.OK))


async def test_the_index_is_bounded_and_expired_answers_drop_out(client: redis.Redis, namespace: str) -> None:
    exact, semantic = caches(client, namespace, max_entries=2)
    for i, head in enumerate(["alpha", "bravo", "charlie"]):
        await answer(exact, semantic, ask(f"r{i}", f"{head} question"))
    index = f"llmbus:{namespace}:semcache:index:acme:{MODEL}"
    assert await client.hlen(index) == 2  # type: ignore[misc]
    assert (await semantic.lookup(ask("q0", "alpha question"), MODEL)).answer is None  # the oldest went
    await client.delete(f"llmbus:{namespace}:cache:{cache_key(ask('r1', 'bravo question'), MODEL)}")
    assert (await semantic.lookup(ask("q1", "bravo question"), MODEL)).answer is None  # its answer expired
    assert await client.hlen(index) == 1  # type: ignore[misc]
    assert (await semantic.lookup(ask("q2", "charlie question"), MODEL)).answer is not None
