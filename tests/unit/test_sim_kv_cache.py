"""BlockPool: ref counts, prefix lookup by chained hash, LRU eviction of free cached blocks."""

from __future__ import annotations

import pytest

from llmbus_services.engine_worker.adapters.engines.sim.kv_cache import BlockPool


def test_allocate_and_free_keep_counts() -> None:
    pool = BlockPool(8)
    blocks = pool.allocate(5)
    assert len(set(blocks)) == 5 and pool.num_free == 3 and pool.usage() == pytest.approx(5 / 8)
    with pytest.raises(RuntimeError):
        pool.allocate(4)
    pool.free(blocks)
    assert pool.num_free == 8 and pool.usage() == 0.0


def test_lookup_stops_at_the_first_miss() -> None:
    pool = BlockPool(8)
    blocks = pool.allocate(3)
    for b, h in zip(blocks, ["h0", "h1", "h2"], strict=True):
        pool.cache_block(b, h)
    assert pool.lookup(["h0", "h1", "h2", "h3"]) == blocks
    assert pool.lookup(["h0", "zz", "h2"]) == blocks[:1]
    assert pool.lookup(["zz", "h1"]) == []


def test_shared_blocks_are_ref_counted() -> None:
    pool = BlockPool(4)
    a = pool.allocate(2)
    pool.cache_block(a[0], "p0")
    hits = pool.lookup(["p0"])
    pool.touch(hits)  # a second request shares the block
    pool.free(a)
    assert pool.ref_cnt[a[0]] == 1 and pool.num_free == 3
    pool.free(hits)
    assert pool.num_free == 4


def test_freed_cached_blocks_are_evicted_least_recent_first_and_tail_first() -> None:
    pool = BlockPool(6)
    old = pool.allocate(3)
    for i, b in enumerate(old):
        pool.cache_block(b, f"old{i}")
    new = pool.allocate(3)
    for i, b in enumerate(new):
        pool.cache_block(b, f"new{i}")
    pool.free(old)
    pool.free(new)
    pool.allocate(2)
    assert pool.evictions_total == 2
    # The older request's tail went first; its first block and the newer request survive.
    assert pool.lookup(["old0", "old1"]) == old[:1]
    assert pool.lookup(["new0", "new1", "new2"]) == new


def test_a_cache_hit_takes_a_free_block_out_of_the_eviction_queue() -> None:
    pool = BlockPool(2)
    a = pool.allocate(1)
    pool.cache_block(a[0], "keep")
    pool.free(a)
    hits = pool.lookup(["keep"])
    assert pool.num_evictable(hits) == 1
    pool.touch(hits)
    pool.allocate(1)  # must take the other block, not the one in use
    assert pool.evictions_total == 0 and pool.lookup(["keep"]) == a


def test_freed_blocks_without_a_hash_are_reused_before_cached_ones() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    pool.cache_block(blocks[0], "kept")
    pool.free(blocks)  # blocks[1:] hold nothing findable
    reused = pool.allocate(3)
    assert sorted(reused) == sorted(blocks[1:]) and pool.evictions_total == 0
    assert pool.lookup(["kept"]) == blocks[:1]
