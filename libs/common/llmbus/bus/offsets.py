"""Which offsets may be committed when records finish out of order (pure, no Kafka)."""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

P = TypeVar("P")


class OffsetTracker(Generic[P]):
    """Per partition: the commit point is the lowest offset still in flight.

    Records start in offset order and may finish in any order; a record's offset is only
    committed once it and every earlier record of its partition are done, so a crash
    redelivers exactly the unfinished tail.
    """

    def __init__(self) -> None:
        self._started: dict[P, deque[int]] = {}
        self._done: dict[P, set[int]] = {}
        self._commit_point: dict[P, int] = {}
        self._committed: dict[P, int] = {}

    def started(self, partition: P, offset: int) -> None:
        self._started.setdefault(partition, deque()).append(offset)
        self._done.setdefault(partition, set())

    def done(self, partition: P, offset: int) -> None:
        started = self._started.get(partition)
        if started is None:  # partition was revoked meanwhile
            return
        done = self._done[partition]
        done.add(offset)
        while started and started[0] in done:
            finished = started.popleft()
            done.discard(finished)
            self._commit_point[partition] = finished + 1

    def in_flight(self, partition: P | None = None) -> int:
        if partition is not None:
            return len(self._started.get(partition, ()))
        return sum(len(q) for q in self._started.values())

    def to_commit(self) -> dict[P, int]:
        """Offsets (next to read) that advanced since the last `committed` call."""
        return {p: o for p, o in self._commit_point.items() if self._committed.get(p) != o}

    def committed(self, offsets: dict[P, int]) -> None:
        self._committed.update(offsets)

    def forget(self, partitions: list[P]) -> None:
        for p in partitions:
            self._started.pop(p, None)
            self._done.pop(p, None)
            self._commit_point.pop(p, None)
            self._committed.pop(p, None)
