"""What cost-accounting publishes, through the runtime's one Publisher: a batch per partition, every ack awaited."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmbus.bus.producer import Publisher
from llmbus.contract import topics as t
from llmbus.contract.messages import CostRecord, Message

# (record, its encoded bytes, key) -> on llm.costs, every ack awaited
Items = Sequence[tuple[CostRecord, bytes, str | None]]


class CostPublisher:
    """`publisher` is asked for at each send: the runtime that owns it may connect after this is built."""

    def __init__(self, publisher: Callable[[], Publisher], topics: t.Topics) -> None:
        self._publisher = publisher
        self._topics = topics

    async def publish_records(self, items: Items) -> None:
        """CostRecords already encoded (the outbox's bytes), onto llm.costs."""
        await self._send_all(self._topics.name(t.COSTS), [(record, payload, key) for record, payload, key in items])

    async def publish_all(self, topic: str, items: Sequence[tuple[Message, str | None]]) -> None:
        await self._send_all(topic, [(message, None, key) for message, key in items])

    async def _send_all(self, topic: str, items: Sequence[tuple[Message, bytes | None, str | None]]) -> None:
        """One record batch per partition, then every ack awaited (bounded): one round trip per batch."""
        publisher = self._publisher()
        await publisher.publish_many(topic, items)
