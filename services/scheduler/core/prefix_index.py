"""Which worker probably holds which prompt blocks, learned from what the scheduler placed.

The hashes are chained (llmbus.tokens.prefix_block_hashes), so block i's hash stands for
the whole prefix up to i and a match is the run of leading hashes a worker holds. Entries
age out (LRU over hashes, and a time to live) because engines evict their caches too: a hash
not placed for `ttl_ms` is dropped, so the index holds what the last `ttl_ms` placed (about
350 bytes a hash), and never more than `max_blocks` hashes.
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixIndex:
    def __init__(self, max_blocks: int = 200_000, ttl_ms: int = 10 * 60_000, max_workers_per_block: int = 4) -> None:
        self.max_blocks = max_blocks
        self.ttl_ms = ttl_ms
        self.max_workers_per_block = max_workers_per_block
        # hash → {worker id → last time it was placed there}; order = least recently used first
        self._blocks: OrderedDict[str, dict[str, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def record(self, worker_id: str, hashes: list[str], now_ms: int) -> None:
        # Tail first, so a prompt's leading blocks are the most recently used and age out last
        # (an engine's LRU evicts a request's tail blocks first too).
        for h in reversed(hashes):
            holders = self._blocks.get(h)
            if holders is None:
                holders = self._blocks[h] = {}
            else:
                self._blocks.move_to_end(h)
            holders[worker_id] = now_ms
            if len(holders) > self.max_workers_per_block:
                del holders[min(holders, key=holders.__getitem__)]
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)
        self._drop_expired(now_ms)

    def _drop_expired(self, now_ms: int) -> None:
        """Hashes are in order of their last placement: the stale ones are at the front."""
        while self._blocks:
            holders = next(iter(self._blocks.values()))
            if holders and now_ms - max(holders.values()) <= self.ttl_ms:
                return
            self._blocks.popitem(last=False)

    def matched_blocks(self, hashes: list[str], now_ms: int) -> dict[str, int]:
        """Per worker, how many leading blocks of `hashes` it holds (workers with none are absent).

        A worker recorded at block i held the whole prefix up to i (the hashes are chained), so
        its match is the deepest block it is recorded at while the chain lasts. It need not be
        among the holders kept for every earlier block: a prefix shared by the whole fleet (a
        system prompt) keeps only its `max_workers_per_block` latest holders.
        """
        matched: dict[str, int] = {}
        for i, h in enumerate(hashes):
            holders = self._blocks.get(h)
            if not holders:
                break
            fresh = False
            for w, t in holders.items():
                if now_ms - t <= self.ttl_ms:
                    matched[w] = i + 1
                    fresh = True
            if not fresh:
                break
        return matched

    def remove_worker(self, worker_id: str) -> None:
        for holders in self._blocks.values():
            holders.pop(worker_id, None)


class SessionIndex:
    """Session id → the worker its last turn went to (bounded LRU)."""

    def __init__(self, max_sessions: int = 100_000) -> None:
        self.max_sessions = max_sessions
        self._last: OrderedDict[str, str] = OrderedDict()

    def record(self, session_id: str | None, worker_id: str) -> None:
        if not session_id:
            return
        self._last[session_id] = worker_id
        self._last.move_to_end(session_id)
        while len(self._last) > self.max_sessions:
            self._last.popitem(last=False)

    def worker_of(self, session_id: str | None) -> str | None:
        return self._last.get(session_id) if session_id else None

    def remove_worker(self, worker_id: str) -> None:
        for sid in [s for s, w in self._last.items() if w == worker_id]:
            del self._last[sid]
