"""SimCore: vLLM-like step loop in virtual time (batching, chunked prefill, prefix cache, preemption)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from llmbus_services.engine_worker.adapters.engines.sim.core import SimCore, SimRequest, StepResult
from llmbus_services.engine_worker.adapters.engines.sim.profiles import SimProfile, get_profile

H100 = get_profile("llama-3.1-8b-h100")
# Round, distinct coefficients so a term that is dropped or swapped shows.
TOY = SimProfile(
    "toy", "toy", "toy", step_base_us=1000.0, prefill_us_per_token=10.0, decode_us_per_seq=100.0, kv_blocks_total=1000
)


def run_to_end(core: SimCore, max_steps: int = 100_000) -> list[StepResult]:
    results = []
    while core.has_work():
        results.append(core.step())
        assert len(results) < max_steps
    return results


def text_of_tokens(n_tokens: int, fill: str) -> str:
    return (fill * (4 * n_tokens))[: 4 * n_tokens]


def test_profiles_carry_the_published_calibration() -> None:
    assert (H100.step_base_us, H100.prefill_us_per_token, H100.decode_us_per_seq) == (5752.705, 17.2509, 5.9991)
    assert 28_000 < H100.kv_blocks_total < 30_000
    a100 = get_profile("llama-3.1-8b-a100")
    assert (round(a100.step_base_us), round(a100.prefill_us_per_token, 1), round(a100.decode_us_per_seq, 1)) == (
        16442,
        47.8,
        18.2,
    )


def test_step_time_follows_the_formula() -> None:
    core = SimCore(TOY)
    core.add(SimRequest("a", prompt_tokens=512, max_tokens=3))
    first = core.step()
    assert (first.prefill_tokens, first.decode_seqs) == (512, 0)
    assert first.duration_us == 1000 + 10 * 512
    core.add(SimRequest("b", prompt_tokens=100, max_tokens=2))
    mixed = core.step()  # a decodes, b prefills
    assert (mixed.prefill_tokens, mixed.decode_seqs) == (100, 1)
    assert mixed.duration_us == 1000 + 10 * 100 + 100 * 1
    decode = core.step()
    assert (decode.prefill_tokens, decode.decode_seqs) == (0, 2)
    assert decode.duration_us == 1000 + 100 * 2
    assert core.now_us == first.duration_us + mixed.duration_us + decode.duration_us


def test_h100_ttft_and_tpot_of_one_request() -> None:
    core = SimCore(H100)
    core.add(SimRequest("a", 512, 5))
    results = run_to_end(core)
    assert math.isclose(results[0].end_us, 5752.705 + 17.2509 * 512)
    assert all(math.isclose(r.duration_us, 5752.705 + 5.9991) for r in results[1:])
    assert len(results) == 5


def test_max_num_seqs_bounds_the_batch() -> None:
    core = SimCore(TOY, max_num_seqs=4)
    for i in range(10):
        core.add(SimRequest(f"r{i}", 10, 50))
    for r in run_to_end(core):
        assert r.num_running <= 4
        assert r.prefill_tokens // 10 + r.decode_seqs <= 4


def test_token_budget_bounds_the_batch_and_chunks_the_overflow() -> None:
    core = SimCore(TOY, max_num_batched_tokens=1000)
    for i in range(4):
        core.add(SimRequest(f"r{i}", 600, 5))
    first = core.step()
    assert first.prefill_tokens == 1000  # r0 whole, r1's first 400 tokens, r2 not yet
    assert [o.request_id for o in first.outputs] == ["r0"]
    assert (first.num_running, first.num_waiting) == (2, 2)
    second = core.step()
    # r0 decodes first, r1 finishes its prefill (200), r2 fits whole (600), r3 gets the last 199.
    assert (second.decode_seqs, second.prefill_tokens) == (1, 999)
    assert [o.request_id for o in second.outputs] == ["r0", "r1", "r2"]


def test_long_prompt_prefill_spreads_over_steps() -> None:
    core = SimCore(TOY, max_num_batched_tokens=1024)
    core.add(SimRequest("long", 3000, 2))
    steps = [core.step() for _ in range(3)]
    assert [s.prefill_tokens for s in steps] == [1024, 1024, 952]
    assert [len(s.outputs) for s in steps] == [0, 0, 1]
    assert steps[2].outputs[0].completion_tokens == 1


def test_decodes_go_before_prefill_chunks() -> None:
    core = SimCore(TOY, max_num_batched_tokens=512)
    core.add(SimRequest("short", 16, 10))
    core.step()
    core.add(SimRequest("long", 5000, 1))
    for _ in range(5):
        step = core.step()
        assert step.decode_seqs == 1 and step.prefill_tokens == 511


def shared_prefix_requests(shared_tokens: int, suffixes: list[str]) -> list[SimRequest]:
    prefix = text_of_tokens(shared_tokens, "system prompt; ")
    return [SimRequest.from_text(f"r{i}", prefix + s, max_tokens=4) for i, s in enumerate(suffixes)]


def test_prefix_cache_hits_for_a_shared_prefix() -> None:
    core = SimCore(TOY)
    a, b = shared_prefix_requests(200, [" question one, rather long" * 10, " another question " * 10])
    core.add(a)
    run_to_end(core)
    core.add(b)
    first = core.step()
    cached = first.outputs[0].cached_prompt_tokens
    assert cached == 192  # 12 full 16-token blocks of the 200 shared tokens
    assert first.prefill_tokens == b.prompt_tokens - cached
    assert core.prefix_cache_hits_total == 192
    assert core.prefix_cache_queries_total == a.prompt_tokens + b.prompt_tokens


def test_prefix_cache_misses_for_different_prefixes() -> None:
    core = SimCore(TOY)
    core.add(SimRequest.from_text("a", text_of_tokens(300, "alpha "), 2))
    run_to_end(core)
    # Same text after the first block: the chained hashes still differ everywhere.
    core.add(SimRequest.from_text("b", "X" + text_of_tokens(300, "alpha ")[1:], 2))
    first = core.step()
    assert first.outputs[0].cached_prompt_tokens == 0
    assert first.prefill_tokens == 300


def test_prefix_caching_can_be_switched_off() -> None:
    core = SimCore(TOY, enable_prefix_caching=False)
    a, b = shared_prefix_requests(200, ["one", "two"])
    core.add(a)
    run_to_end(core)
    core.add(b)
    assert core.step().outputs[0].cached_prompt_tokens == 0


def test_preempted_request_recomputes_from_its_cached_blocks() -> None:
    # A preempted request's freed blocks stay cached, so its recompute skips them if not evicted.
    core = SimCore(TOY, kv_blocks_total=12, max_num_batched_tokens=4096)
    core.add(SimRequest("old", 64, 40))  # grows to 104 tokens = 7 blocks
    core.add(SimRequest("young", 64, 40))
    results = run_to_end(core)
    assert core.preemptions_total >= 1
    assert core.prefix_cache_hits_total > 0
    assert sum(o.new_tokens for r in results for o in r.outputs) == 80


def test_lru_eviction_evicts_the_least_recently_freed_blocks_first() -> None:
    core = SimCore(TOY, kv_blocks_total=16)
    first = SimRequest("first", 65, 1)  # 65 tokens → 5 blocks, 4 of them full and cached
    second = SimRequest("second", 65, 1)
    for req in (first, second):
        core.add(req)
        run_to_end(core)
    # 10 blocks: first the uncached partial block "second" left at the head, the 7 never
    # used, then from the LRU end "first"'s cached blocks, its tail first.
    core.add(SimRequest("filler", 150, 1))
    run_to_end(core)
    assert core.pool.evictions_total == 2
    # "first" was freed earlier, so it lost blocks; "second" is still fully cached.
    assert core.cached_tokens(SimRequest("first-again", 65, 1, content_key="first")) == 32
    assert core.cached_tokens(SimRequest("second-again", 65, 1, content_key="second")) == 64
    assert core.cached_tokens(SimRequest("other", 65, 1)) == 0
    # Running the repeat really skips what the cache holds.
    core.add(SimRequest("second-again", 65, 1, content_key="second"))
    step = core.step()
    assert (step.outputs[0].cached_prompt_tokens, step.prefill_tokens) == (64, 1)


def test_preemption_under_kv_pressure_loses_no_request() -> None:
    core = SimCore(TOY, kv_blocks_total=40, max_num_seqs=16)
    for i in range(8):
        core.add(SimRequest(f"r{i}", 100, 200))  # each ends at 300 tokens = 19 blocks
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(8)}
    finished = {}
    for result in run_to_end(core):
        for out in result.outputs:
            assert out.request_id not in finished
            tokens[out.request_id].append(out.completion_tokens)
            if out.finished:
                finished[out.request_id] = out.finish_reason
    assert core.preemptions_total > 0
    assert finished == {f"r{i}": "length" for i in range(8)}
    for counts in tokens.values():
        assert counts == list(range(1, 201))  # every token once, in order, none lost or repeated
    assert core.pool.num_free == 40
    assert core.generation_tokens_total == 8 * 200


def test_abort_running_and_waiting() -> None:
    core = SimCore(TOY, max_num_seqs=1)
    core.add(SimRequest("run", 32, 100))
    core.add(SimRequest("wait", 32, 100))
    core.step()
    assert core.pool.num_free < core.pool.num_blocks
    final = core.abort("run")
    assert final is not None and final.finished and final.finish_reason == "abort" and final.completion_tokens == 1
    assert core.pool.num_free == core.pool.num_blocks  # its blocks are back (cached blocks count as free)
    assert core.abort("wait") is not None
    assert core.abort("wait") is None and core.abort("never") is None
    assert not core.has_work()
    assert core.step().outputs == []


def test_refuses_what_could_never_run() -> None:
    core = SimCore(TOY, kv_blocks_total=10, max_model_len=1000)
    assert core.refusal(900, 200) is not None  # longer than the model
    assert core.refusal(100, 100) is not None  # 13 blocks > 10
    assert core.refusal(100, 50) is None
    assert core.refusal(10, 0) is not None


def trace(seed: int) -> list[tuple[float, SimRequest]]:
    import random

    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(60):
        t += rng.expovariate(1 / 20_000)
        out.append((t, SimRequest(f"r{i}", rng.randint(1, 600), rng.randint(1, 80), content_key=f"k{i % 7}")))
    return out


def replay(arrivals: list[tuple[float, SimRequest]], **kwargs: int) -> list[tuple]:
    core = SimCore(TOY, **kwargs)
    log: list[tuple] = []
    pending = list(arrivals)
    while pending or core.has_work():
        while pending and pending[0][0] <= core.now_us:
            t, req = pending.pop(0)
            core.add(req, arrival_us=t)
        if not core.has_work():
            core.advance_to(pending[0][0])
            continue
        r = core.step()
        log.append((r.start_us, r.duration_us, tuple(r.outputs), tuple(r.preempted)))
    return log


def test_same_input_same_run() -> None:
    assert replay(trace(1), kv_blocks_total=60) == replay(trace(1), kv_blocks_total=60)
    assert replay(trace(1), kv_blocks_total=60) != replay(trace(2), kv_blocks_total=60)


@settings(max_examples=25, deadline=None)
@given(
    prompts=st.lists(st.tuples(st.integers(1, 400), st.integers(1, 60), st.integers(0, 3)), min_size=1, max_size=25),
    kv_blocks=st.integers(30, 120),
    max_num_seqs=st.integers(1, 8),
    budget=st.integers(16, 512),
)
def test_invariants_hold_for_any_workload(
    prompts: list[tuple[int, int, int]], kv_blocks: int, max_num_seqs: int, budget: int
) -> None:
    core = SimCore(TOY, kv_blocks_total=kv_blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    wanted = {}
    for i, (prompt, max_tokens, group) in enumerate(prompts):
        req = SimRequest(f"r{i}", prompt, max_tokens, content_key=f"g{group}")
        if core.refusal(prompt, max_tokens) is None:
            core.add(req)
            wanted[req.request_id] = max_tokens
    got = dict.fromkeys(wanted, 0)
    for result in run_to_end(core):
        assert result.prefill_tokens + result.decode_seqs <= budget
        assert result.num_running <= max_num_seqs
        for out in result.outputs:
            got[out.request_id] += out.new_tokens
    assert got == wanted
    assert core.pool.num_free == kv_blocks
    assert all(c == 0 for c in core.pool.ref_cnt)


def test_waiting_request_is_admitted_only_when_its_whole_prompt_fits() -> None:
    # 20 blocks; "big" holds 12 of them for a while; "next" needs 10 blocks for its prompt.
    for admit_full_prompt, expect_next_in_step_2 in ((True, False), (False, True)):
        core = SimCore(TOY, kv_blocks_total=20, max_num_batched_tokens=64, admit_full_prompt=admit_full_prompt)
        core.add(SimRequest("big", 190, 20))  # 190 + 2 tokens → 12 blocks by the end
        for _ in range(3):
            core.step()  # big prefills 64 tokens a step: 12 blocks after its third chunk
        core.add(SimRequest("next", 160, 5))
        step = core.step()
        assert ("next" in step.num_scheduled_tokens) is expect_next_in_step_2


def test_each_request_reports_how_often_it_was_preempted() -> None:
    # What the worker records per request (InferenceResult.preemptions; `llmbus trace` shows it).
    core = SimCore(TOY, kv_blocks_total=40, max_num_seqs=16)
    for i in range(8):
        core.add(SimRequest(f"r{i}", 100, 200))
    per_request: dict[str, int] = {}
    for result in run_to_end(core):
        for out in result.outputs:
            assert out.preemptions >= per_request.get(out.request_id, 0)  # a count, never going back
            per_request[out.request_id] = out.preemptions
    assert sum(per_request.values()) == core.preemptions_total > 0


def test_prefill_backlog_is_what_waits_and_the_rest_of_chunked_prefills() -> None:
    """The engine's own count of prompt tokens admitted and not yet prefilled (the worker's heartbeat field):
    waiting prompts whole, a chunked prefill's remainder, nothing for a decode."""
    core = SimCore(get_profile("llama-3.1-8b-h100"), max_num_batched_tokens=1000, enable_prefix_caching=False)
    core.add(SimRequest("a", 2500, 4))
    core.add(SimRequest("b", 300, 4))
    assert core.prefill_backlog_tokens() == 2800
    core.step()  # a: 1000 of 2500 (the budget); b waits
    assert core.prefill_backlog_tokens() == 1500 + 300
    core.step()  # a: the next 1000
    core.step()  # a: its last 500 and its first token; b: 300 and its first token
    assert core.prefill_backlog_tokens() == 0
    core.step()  # decodes only
    assert core.prefill_backlog_tokens() == 0
