"""SimCore's host-memory KV tier (vLLM's native CPU offloading): store as computed, load instead of recompute."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbus_services.engine_worker.adapters.engines.sim.core import SimCore, SimRequest, StepResult
from llmbus_services.engine_worker.adapters.engines.sim.kv_cache import HostKvTier
from llmbus_services.engine_worker.adapters.engines.sim.profiles import SimProfile, get_profile
from tests.unit.test_sim_core import run_to_end

# 50,000-byte blocks over a 1 GB/s link: 50 µs a block, easy to see in the clock.
TOY = SimProfile(
    "toy",
    "toy",
    "toy",
    step_base_us=1000.0,
    prefill_us_per_token=10.0,
    decode_us_per_seq=100.0,
    kv_blocks_total=1000,
    kv_block_bytes=50_000,
    host_link_gb_per_s=1.0,
)


def test_host_tier_is_an_lru_of_block_hashes() -> None:
    tier = HostKvTier(3)
    for h in ("a", "b", "c"):
        tier.store(h)
    assert tier.lookup(["a", "b", "x", "c"]) == 2  # stops at the first miss; a, b now most recent
    tier.store("d")  # evicts c, the least recently used
    assert tier.lookup(["c"]) == 0
    assert tier.lookup(["a", "b", "d"]) == 3
    assert (len(tier), tier.stores_total, tier.evictions_total) == (3, 4, 1)
    tier.store("a")  # already held: a refresh, not a second copy
    assert (len(tier), tier.stores_total) == (3, 4)
    with pytest.raises(ValueError):
        HostKvTier(0)


def test_h100_profile_prices_a_block_copy_over_pcie() -> None:
    h100 = get_profile("llama-3.1-8b-h100")
    assert h100.kv_block_bytes == 2 * 32 * 8 * 128 * 2 * 16  # K,V x layers x KV heads x dims x bf16 x tokens
    assert h100.host_load_us_per_block == pytest.approx(2_097_152 / 50e3)
    assert h100.host_kv_blocks(200) == 200 * 512  # 200 GiB of 2 MiB blocks
    assert h100.host_kv_blocks(0) == 0
    with pytest.raises(ValueError):
        _ = SimProfile("bare", "m", "g", 1.0, 1.0, 1.0, 10).host_load_us_per_block


def evicted_then_repeated(host_kv_blocks: int) -> tuple[SimCore, list[StepResult]]:
    """ "a" runs, a filler evicts all of a's GPU blocks, then "a" comes back with the same prompt."""
    core = SimCore(TOY, kv_blocks_total=20, host_kv_blocks=host_kv_blocks)
    core.add(SimRequest("a", 161, 1, content_key="doc"))  # 10 full blocks + 1 token
    run_to_end(core)
    core.add(SimRequest("filler", 318, 1))  # all 20 blocks: every cached block of "a" is reused
    run_to_end(core)
    assert core.cached_tokens(SimRequest("probe", 161, 1, content_key="doc")) == 0
    core.add(SimRequest("a-again", 161, 1, content_key="doc"))
    return core, run_to_end(core)


def test_without_a_host_tier_an_evicted_prefix_is_recomputed() -> None:
    _core, steps = evicted_then_repeated(host_kv_blocks=0)
    assert [s.prefill_tokens for s in steps] == [161]
    assert steps[0].outputs[0].cached_prompt_tokens == 0


def test_an_evicted_prefix_is_loaded_from_the_host_tier_not_recomputed() -> None:
    core, steps = evicted_then_repeated(host_kv_blocks=100)
    start = steps[0].start_us
    # First an idle step while the 10 blocks cross the link (10 x 50 µs), then only the last token.
    assert (steps[0].duration_us, steps[0].outputs) == (500.0, [])
    assert [s.prefill_tokens for s in steps[1:]] == [1]
    out = steps[-1].outputs[0]
    assert (out.cached_prompt_tokens, out.host_loaded_tokens) == (160, 160)
    assert steps[-1].end_us - start == 500 + 1000 + 10 * 1
    assert (core.host_cache_hits_total, core.prefix_cache_hits_total) == (160, 0)


def test_gpu_hits_come_first_and_the_host_tier_supplies_the_rest() -> None:
    core = SimCore(TOY, kv_blocks_total=40, host_kv_blocks=100)
    core.add(SimRequest("long", 321, 1, content_key="doc"))  # 20 full blocks
    run_to_end(core)
    # Evict the 12 blocks freed last (the tail of "long" goes first, as in vLLM).
    core.add(SimRequest("filler", 16 * 32, 1))
    run_to_end(core)
    gpu_held = core.cached_tokens(SimRequest("probe", 321, 1, content_key="doc"))
    assert 0 < gpu_held < 320
    core.add(SimRequest("again", 321, 1, content_key="doc"))
    steps = run_to_end(core)
    out = steps[-1].outputs[0]
    assert out.cached_prompt_tokens == 320
    assert out.host_loaded_tokens == 320 - gpu_held
    assert steps[0].duration_us == (320 - gpu_held) // 16 * 50


def test_loads_share_one_link_and_other_work_runs_meanwhile() -> None:
    core, _ = evicted_then_repeated(host_kv_blocks=100)
    core.add(SimRequest("b-again", 161, 1, content_key="doc"))  # on the GPU now: no load
    core.add(SimRequest("fresh", 16, 3))
    first = core.step()
    assert set(first.num_scheduled_tokens) == {"b-again", "fresh"}


def test_two_loads_queue_on_the_link() -> None:
    core = SimCore(TOY, kv_blocks_total=30, host_kv_blocks=100)
    for key in ("x", "y"):
        core.add(SimRequest(key, 81, 1, content_key=key))  # 5 full blocks each
    run_to_end(core)
    core.add(SimRequest("filler", 16 * 29, 1))
    run_to_end(core)
    t0 = core.now_us
    core.add(SimRequest("x2", 81, 1, content_key="x"))
    core.add(SimRequest("y2", 81, 1, content_key="y"))
    first_token = {}
    for step in run_to_end(core):
        for out in step.outputs:
            first_token[out.request_id] = step.end_us - t0
    # x2's 5 blocks land at 250 µs, y2's at 500 µs (the link copies one load at a time).
    assert first_token["x2"] == 250 + 1000 + 10
    assert first_token["y2"] >= 500 + 1000 + 10


def test_aborting_a_request_while_its_blocks_load_frees_them() -> None:
    core, _ = evicted_then_repeated(host_kv_blocks=100)
    core.add(SimRequest("filler2", 318, 1))
    run_to_end(core)
    core.add(SimRequest("again", 161, 1, content_key="doc"))
    step = core.step()
    assert step.outputs == [] and core.loading
    final = core.abort("again")
    assert final is not None and final.finish_reason == "abort"
    assert not core.has_work() and core.pool.num_free == core.pool.num_blocks


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(
        st.tuples(st.integers(1, 600), st.integers(1, 40), st.integers(0, 4), st.integers(0, 30)),
        min_size=1,
        max_size=30,
    ),
    kv_blocks=st.integers(20, 60),
    host_blocks=st.integers(1, 300),
    max_num_seqs=st.integers(1, 8),
    budget=st.sampled_from([16, 64, 256, 2048]),
)
def test_invariants_hold_with_a_host_tier(
    prompts: list[tuple[int, int, int, int]], kv_blocks: int, host_blocks: int, max_num_seqs: int, budget: int
) -> None:
    # Small pools, shared prefixes, arrivals between steps: loads, preemptions and stalls all happen.
    core = SimCore(
        TOY,
        kv_blocks_total=kv_blocks,
        host_kv_blocks=host_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
    )
    wanted: dict[str, int] = {}
    got: dict[str, int] = {}

    def step() -> None:
        result = core.step()
        assert result.num_running <= max_num_seqs
        assert result.prefill_tokens + result.decode_seqs <= budget
        for out in result.outputs:
            got[out.request_id] = got.get(out.request_id, 0) + out.new_tokens
            assert out.host_loaded_tokens <= out.cached_prompt_tokens < out.prompt_tokens

    for i, (prompt, max_tokens, group, steps_after) in enumerate(prompts):
        if core.refusal(prompt, max_tokens) is None:
            core.add(SimRequest(f"r{i}", prompt, max_tokens, content_key=f"g{group}"))
            wanted[f"r{i}"] = max_tokens
        for _ in range(steps_after):
            if core.has_work():
                step()
    while core.has_work():
        step()
    assert got == wanted
    assert core.pool.num_free == kv_blocks and all(c == 0 for c in core.pool.ref_cnt)
    assert core.host is not None and len(core.host) <= host_blocks
