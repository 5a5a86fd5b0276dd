"""The virtual-time replay behind bench.sched_bench: every request ends; a host KV tier shows in the hits."""

from __future__ import annotations

import json

import pytest

from bench.sched_replay import ReplayConfig, load_trace, replay
from bench.traces import MOONCAKE_CONVERSATION
from llmbus_services.engine_worker.adapters.engines.sim.profiles import get_profile

H100 = get_profile("llama-3.1-8b-h100")


@pytest.fixture(scope="module")
def trace():
    if not MOONCAKE_CONVERSATION.exists():
        pytest.skip(f"trace not found: {MOONCAKE_CONVERSATION}")
    with MOONCAKE_CONVERSATION.open() as f:
        rows = [json.loads(next(f)) for _ in range(300)]
    return load_trace(rows, block_tokens=16)


def run(trace, policy: str, host_kv_blocks: int = 0):
    # A GPU cache of 8,000 blocks (128k tokens: the longest of these prompts fits) so that prefixes
    # are evicted within 300 requests of ~12k prompt tokens each.
    cfg = ReplayConfig(workers=4, time_scale=4.0, kv_blocks_total=8_000, host_kv_blocks=host_kv_blocks)
    return replay(trace, policy, H100, cfg)


@pytest.fixture(scope="module")
def with_host(trace):
    """The replay with a host KV tier: both tests read it, it is run once (it takes seconds)."""
    return run(trace, "default", host_kv_blocks=40_000)


def test_every_request_gets_its_tokens(trace, with_host) -> None:
    res = with_host
    assert len(res.e2e_ms) == len(res.ttft_ms) == len(trace) and not res.errors
    assert res.output_tokens == sum(r.output_tokens for r in trace)
    assert sum(res.per_worker_requests.values()) == len(trace)


def test_a_host_tier_turns_evicted_prefixes_into_hits(trace, with_host) -> None:
    gpu_only = run(trace, "default")
    assert gpu_only.host_loaded_tokens == 0 < with_host.host_loaded_tokens
    assert with_host.cached_prompt_tokens > gpu_only.cached_prompt_tokens
