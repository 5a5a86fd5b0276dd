"""Records a handler keeps open after it returns: the commit point waits until it releases them.

A handler whose effect is not finished when it returns -- cost-accounting holds a self-hosted
result until its worker's interval closes and it is billed -- holds the record. The consumer loop
then counts the record done only when the handler releases it, so its partition's committed
offset never passes it: whatever kills the process (or empties a store the handler keeps its
half-finished work in), the next reader of the partition reads it again. A partition revoked in a
rebalance drops its holds here; its new reader reads them again from the commit point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from aiokafka.structs import ConsumerRecord, TopicPartition

V = TypeVar("V")


class Holds(Generic[V]):
    """The records held open (with what the handler keeps of each), by partition and offset."""

    def __init__(self) -> None:
        self._held: dict[TopicPartition, dict[int, V]] = {}
        self._on_release: Callable[[TopicPartition, int], None] | None = None

    def bind(self, on_release: Callable[[TopicPartition, int], None]) -> None:
        """The consumer loop's: a released record is done (the commit point may pass it)."""
        self._on_release = on_release

    def hold(self, record: ConsumerRecord, value: V) -> None:
        self._held.setdefault(TopicPartition(record.topic, record.partition), {})[record.offset] = value

    def is_held(self, tp: TopicPartition, offset: int) -> bool:
        return offset in self._held.get(tp, {})

    def release(self, tp: TopicPartition, offset: int) -> None:
        if self._held.get(tp, {}).pop(offset, None) is not None and self._on_release is not None:
            self._on_release(tp, offset)

    def discard(self, tp: TopicPartition, offset: int) -> None:
        """Not held any more, and not done by a release (its handling failed: it was dead-lettered)."""
        self._held.get(tp, {}).pop(offset, None)

    def forget(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._held.pop(tp, None)

    def items(self) -> Iterator[tuple[TopicPartition, int, V]]:
        for tp, held in list(self._held.items()):
            for offset, value in list(held.items()):
                yield tp, offset, value

    def __len__(self) -> int:
        return sum(len(held) for held in self._held.values())
