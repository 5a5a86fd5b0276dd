"""Prefix caches per tenant: no tenant can probe another's prompts through `cached_tokens`.

A right guess of another tenant's system prompt or document used to show as cached tokens: the
scheduler's prefix hashes and the engines' caches were shared by every tenant. Now the router gives
every routed request a cache salt (its tenant's, or its tenant policy's `cache_group`), the scheduler's
hashes and the engines' caches take it, and a hosted upstream's shared cache reports nothing.
"""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from llmbus.contract.messages import Dispatch, InferenceRequest, InferenceResult, ResultStatus, RoutedRequest
from llmbus_services.engine_worker.adapters.engines.sim.engine import SimConfig, SimEngine
from llmbus_services.router.core.config import RouterPolicy, TenantPolicy, load_policy
from llmbus_services.scheduler.core.prefix_index import PrefixIndex
from llmbus_services.scheduler.core.types import SchedRequest
from tests.unit.test_router_pipeline import core as router_core
from tests.unit.test_worker_request_errors import worker

SYSTEM_PROMPT = "You are the support assistant of ACME. Internal escalation code: 7731-ALPHA. " * 20


def routed(tenant: str, request_id: str = "r", cache_group: str | None = None) -> RoutedRequest:
    request = InferenceRequest(request_id=request_id, tenant=tenant, prompt=SYSTEM_PROMPT + request_id, max_tokens=4)
    return RoutedRequest(request=request, model="sim-llama-8b", cache_group=cache_group)


def test_the_schedulers_prefix_hashes_are_salted_per_tenant_and_shared_only_in_a_cache_group() -> None:
    acme, globex = SchedRequest.from_routed(routed("acme"), 0), SchedRequest.from_routed(routed("globex"), 0)
    assert len(acme.prefix_block_hashes) > 4
    assert not set(acme.prefix_block_hashes) & set(globex.prefix_block_hashes)
    index = PrefixIndex()
    index.record("w1", acme.prefix_block_hashes, now_ms=1000)
    assert index.matched_blocks(SchedRequest.from_routed(routed("acme", "r2"), 0).prefix_block_hashes, 1000)
    assert index.matched_blocks(globex.prefix_block_hashes, 1000) == {}, "globex is steered to acme's cache"
    grouped = [SchedRequest.from_routed(routed(t, cache_group="acme-corp"), 0) for t in ("acme", "acme-eu")]
    assert grouped[0].prefix_block_hashes == grouped[1].prefix_block_hashes


async def test_the_router_sets_the_tenants_cache_group_and_nothing_else_can() -> None:
    base = load_policy()
    tenants = base.tenants | {
        "acme": TenantPolicy(cache_group="acme-corp"),
        "acme-eu": TenantPolicy(cache_group="acme-corp"),
    }
    policy = RouterPolicy.model_validate(
        base.model_dump() | {"tenants": {k: v.model_dump() for k, v in tenants.items()}}
    )
    c = router_core(policy)
    outcomes = [await c.route(InferenceRequest(tenant=t, prompt=SYSTEM_PROMPT)) for t in ("acme", "acme-eu", "globex")]
    salts = [o.routed.cache_salt for o in outcomes if o.routed is not None]
    assert [o.routed.cache_group for o in outcomes if o.routed] == ["acme-corp", "acme-corp", None]
    assert salts[0] == salts[1] != salts[2]
    assert len(salts[2]) <= 128 and not set("@/\\\0") & set(salts[2])  # what vLLM takes as a cache_salt


async def test_a_sim_worker_reports_no_cached_tokens_for_another_tenants_prefix() -> None:
    """Through the worker's handlers: acme's prompt is cached for acme, never for globex."""
    handlers, publisher = worker(SimEngine(SimConfig(speedup=0)))

    async def run(tenant: str, request_id: str) -> InferenceResult:
        request = InferenceRequest(request_id=request_id, tenant=tenant, prompt=SYSTEM_PROMPT, max_tokens=4)
        raw = Dispatch(routed=RoutedRequest(request=request, model="sim-llama-8b"), worker_id="w1").to_bytes()
        await handlers.on_dispatch(ConsumerRecord("x.llm.dispatch.w1", 0, 0, 0, 0, None, raw, None, 0, len(raw), []))
        [result] = [r for r in publisher.of(InferenceResult) if r.request_id == request_id]
        assert result.status == ResultStatus.OK
        return result

    first = await run("acme", "a1")
    again = await run("acme", "a2")
    probe = await run("globex", "g1")
    assert first.usage.cached_prompt_tokens == 0 and again.usage.cached_prompt_tokens > 0
    assert probe.usage.cached_prompt_tokens == 0, "globex learns that acme sent this prompt"
    assert probe.text == first.text  # the answer does not depend on the tenant, only the cache does
