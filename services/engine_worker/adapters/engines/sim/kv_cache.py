"""Paged KV cache with prefix caching, in the manner of vLLM v1's BlockPool.

Blocks are ids 0..n-1 with a reference count. A full, block gets the chained hash of its
tokens and stays findable by that hash after its request frees it, until it is reused
for something else. Free blocks wait in one queue and allocation takes from its head:
freed blocks without a hash go to the head (nothing to lose by reusing them first),
freed cached blocks to the tail (LRU), a request's blocks in reverse order so its tail
blocks are evicted before the prefix others may share — as vLLM's BlockPool does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[str | None] = [None] * num_blocks
        # OrderedDict as an LRU queue with O(1) removal of a block that gets a cache hit.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # block hash → the blocks holding it (two requests can compute the same block before
        # either is cached; like vLLM, both stay findable, the first one is handed out).
        self._cached: dict[str, dict[int, None]] = {}
        self.evictions_total = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def lookup(self, hashes: Iterable[str]) -> list[int]:
        """Blocks of the longest cached prefix of `hashes` (stops at the first miss)."""
        hits: list[int] = []
        cached = self._cached
        for block_hash in hashes:
            holders = cached.get(block_hash)
            if not holders:
                break
            hits.append(next(iter(holders)))
        return hits

    def num_evictable(self, blocks: Iterable[int]) -> int:
        """How many of `blocks` sit in the free queue (touching them takes them out of it)."""
        return sum(1 for b in blocks if self.ref_cnt[b] == 0)

    def touch(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            if self.ref_cnt[b] == 0:
                del self._free[b]
            self.ref_cnt[b] += 1

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks, {len(self._free)} free")
        out: list[int] = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            old_hash = self.block_hash[b]
            if old_hash is not None:
                # Reusing a cached free block evicts its contents from the prefix cache.
                holders = self._cached[old_hash]
                del holders[b]
                if not holders:
                    del self._cached[old_hash]
                self.block_hash[b] = None
                self.evictions_total += 1
            self.ref_cnt[b] = 1
            out.append(b)
        return out

    def free(self, blocks: list[int]) -> None:
        reuse_first: list[int] = []
        for b in reversed(blocks):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                if self.block_hash[b] is None:
                    reuse_first.append(b)
                else:
                    self._free[b] = None
        for b in reversed(reuse_first):  # so that reuse_first[0] ends up at the head
            self._free[b] = None
            self._free.move_to_end(b, last=False)

    def cache_block(self, block: int, block_hash: str) -> None:
        """Make a full block findable by its hash."""
        if self.block_hash[block] is not None:
            return
        self.block_hash[block] = block_hash
        self._cached.setdefault(block_hash, {})[block] = None


class HostKvTier:
    """KV blocks kept in host memory behind the GPU pool, as vLLM's native CPU offloading keeps them.

    With `--kv-offloading-size` vLLM (OffloadingConnector, LRU policy) stores every block it
    computes into a CPU buffer as well, asynchronously, and when a waiting request's prefix runs
    past the GPU's prefix cache into blocks the CPU buffer still holds, loads those back before
    the request is scheduled instead of recomputing them. This is that buffer's bookkeeping: an
    LRU of block hashes bounded by `num_blocks` (block contents are not simulated).
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self._lru: OrderedDict[str, None] = OrderedDict()
        self.stores_total = 0
        self.evictions_total = 0

    def __len__(self) -> int:
        return len(self._lru)

    def store(self, block_hash: str) -> None:
        lru = self._lru
        if block_hash in lru:
            lru.move_to_end(block_hash)
            return
        lru[block_hash] = None
        self.stores_total += 1
        if len(lru) > self.num_blocks:
            lru.popitem(last=False)
            self.evictions_total += 1

    def lookup(self, hashes: Iterable[str]) -> int:
        """How many leading `hashes` the tier holds; those become most recently used."""
        n = 0
        lru = self._lru
        for block_hash in hashes:
            if block_hash not in lru:
                break
            lru.move_to_end(block_hash)
            n += 1
        return n
