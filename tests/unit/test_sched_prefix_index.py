"""The prefix index: leading-run matches, LRU bound, ageing, forgetting a worker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmbus.tokens import prefix_block_hashes
from llmbus_services.scheduler.core.prefix_index import PrefixIndex, SessionIndex


def test_match_counts_only_the_leading_run() -> None:
    index = PrefixIndex()
    index.record("w1", ["a", "b", "c"], 0)
    assert index.matched_blocks(["a", "b", "x", "c"], 0) == {"w1": 2}
    assert index.matched_blocks(["x", "a"], 0) == {}


def test_real_chained_hashes_share_exactly_the_common_prefix() -> None:
    shared = "s" * 64 * 5  # five 16-token blocks
    one = prefix_block_hashes(shared + "a" * 64 * 3)
    two = prefix_block_hashes(shared + "b" * 64 * 3)
    index = PrefixIndex()
    index.record("w1", one, 0)
    assert index.matched_blocks(two, 0) == {"w1": 5}
    assert index.matched_blocks(one, 0) == {"w1": 8}


def test_a_worker_matches_deep_blocks_without_being_a_kept_holder_of_a_shared_prefix() -> None:
    # "s" is a system prompt every conversation starts with: only its 2 latest holders are kept.
    index = PrefixIndex(max_workers_per_block=2)
    index.record("w1", ["s", "a1", "a2"], 0)
    index.record("w2", ["s", "b1"], 1)
    index.record("w3", ["s", "c1"], 2)
    assert index.matched_blocks(["s", "a1", "a2", "a3"], 3) == {"w1": 3, "w2": 1, "w3": 1}


def test_a_prompts_tail_blocks_age_out_before_its_prefix() -> None:
    index = PrefixIndex(max_blocks=3)
    index.record("w1", ["a", "b", "c"], 0)
    index.record("w2", ["x"], 1)  # one over the bound: c, the tail, goes
    assert index.matched_blocks(["a", "b", "c"], 1) == {"w1": 2}


def test_bounded_lru_evicts_least_recently_used_hashes() -> None:
    index = PrefixIndex(max_blocks=4)
    index.record("w1", ["a", "b"], 0)
    index.record("w2", ["c", "d"], 1)
    index.record("w1", ["a"], 2)  # a is fresh again
    index.record("w3", ["e"], 3)  # evicts b (the oldest use)
    assert len(index) == 4
    assert index.matched_blocks(["a", "b"], 3) == {"w1": 1}
    assert index.matched_blocks(["c", "d"], 3) == {"w2": 2}


def test_entries_age_out_after_ttl() -> None:
    index = PrefixIndex(ttl_ms=100)
    index.record("w1", ["a", "b"], 0)
    index.record("w2", ["a"], 80)
    assert index.matched_blocks(["a", "b"], 50) == {"w1": 2, "w2": 1}
    assert index.matched_blocks(["a", "b"], 150) == {"w2": 1}


def test_remove_worker_forgets_it() -> None:
    index = PrefixIndex()
    index.record("w1", ["a"], 0)
    index.record("w2", ["a"], 0)
    index.remove_worker("w1")
    assert index.matched_blocks(["a"], 0) == {"w2": 1}


@given(
    st.lists(
        st.tuples(st.sampled_from(["w1", "w2", "w3"]), st.lists(st.sampled_from("abcdefgh"), max_size=6)), max_size=40
    ),
    st.integers(1, 10),
)
def test_never_exceeds_its_bound(records, bound) -> None:
    index = PrefixIndex(max_blocks=bound, max_workers_per_block=2)
    for t, (worker, hashes) in enumerate(records):
        index.record(worker, hashes, t)
        assert len(index) <= bound
        assert all(len(h) <= 2 for h in index._blocks.values())


def test_session_index_is_bounded_and_forgets_workers() -> None:
    sessions = SessionIndex(max_sessions=2)
    sessions.record("s1", "w1")
    sessions.record("s2", "w2")
    sessions.record("s3", "w1")
    assert sessions.worker_of("s1") is None and sessions.worker_of("s3") == "w1"
    sessions.remove_worker("w1")
    assert sessions.worker_of("s3") is None and sessions.worker_of("s2") == "w2"


def test_the_schedulers_index_grows_to_what_the_fleets_kv_tiers_hold() -> None:
    from llmbus_services.scheduler.core.pipeline import Pipeline
    from llmbus_services.scheduler.core.scheduler import CoreConfig, SchedulerCore
    from tests.unit.test_sched_filters import NOW_MS, hb

    core = SchedulerCore(Pipeline.load("default"), CoreConfig(prefix_index_max_blocks=1_000))
    core.on_heartbeat(hb("w1", kv_blocks_total=300), NOW_MS)
    assert core.prefix_index.max_blocks == 1_000  # the configured floor
    # 16-token blocks: GPU 29,205 + a 256 GiB host tier of 2 MiB blocks (131,072).
    core.on_heartbeat(hb("w1", kv_blocks_total=29_205, kv_offload_blocks_total=131_072), NOW_MS)
    core.on_heartbeat(hb("w2", kv_blocks_total=29_205), NOW_MS)
    assert core.prefix_index.max_blocks == 2 * 29_205 + 131_072
    # vLLM's CPU build uses 128-token blocks: 8 index entries (16-token hashes) each.
    core.on_heartbeat(hb("w3", kv_blocks_total=1_000, kv_block_size=128), NOW_MS)
    assert core.prefix_index.max_blocks == 2 * 29_205 + 131_072 + 8_000


def test_hashes_not_placed_for_the_ttl_are_dropped_not_only_unmatched() -> None:
    # The soak's scheduler grew by the hashes of every prompt it ever placed (bounded only by
    # max_blocks); what the ttl says no engine still holds now leaves the index.
    index = PrefixIndex(ttl_ms=100)
    index.record("w1", ["a", "b"], 0)
    index.record("w2", ["c"], 50)
    index.record("w1", ["a"], 90)  # a placed again: fresh
    index.record("w3", ["d"], 160)  # b (last placed at 0) is past the ttl, c (50) too
    assert len(index) == 2
    assert index.matched_blocks(["a"], 160) == {"w1": 1}
    index.remove_worker("w1")
    index.record("w3", ["e"], 161)  # a has no holder left: dropped too
    assert len(index) == 2
