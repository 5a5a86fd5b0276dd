"""What a service reads outside its subscriptions, through its runtime: declared start-up reads (a table,
or a topic from a time on), tails from the log's end, and its own topics made (llmbus.bus.service).

A runtime on llmbus.bus.memory answers them from its log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmbus.bus.admin import ensure_topics
from llmbus.bus.bindings import Binding
from llmbus.bus.producer import Publisher
from llmbus.bus.runtime import Bus
from llmbus.bus.subscriptions import unbound
from llmbus.bus.tables import read_since, read_table
from llmbus.bus.tail import TopicTail
from llmbus.contract.declarations import Contract, Reads
from llmbus.contract.topics import Topics, TopicSpec
from llmbus.settings import BusSettings


class ServiceReads:
    """The part of ServiceRuntime that reads outside the subscriptions, and its bus's parts by name."""

    bus: Bus
    contract: Contract

    @property
    def publisher(self) -> Publisher:
        return self.bus.publisher

    @property
    def topics(self) -> Topics:
        return self.bus.topics

    @property
    def settings(self) -> BusSettings:
        return self.bus.settings

    async def read_table(self, name: str, key_of: Callable[[Any], str] | None = None) -> dict[str, Any]:
        """The declared start-up read `name` (`at_start`): every key's latest value, as of now."""
        reads = self._at_start(name)
        topic = self.topics.name(reads.topics[0])
        return await read_table(self.settings, topic, reads.model, self.settings.admin_timeout_s, key_of)

    async def read_since(self, name: str, since_ms: int, timeout_s: float) -> list[Any]:
        """The declared start-up read `name`: every message written from `since_ms` to the end as of now
        (NotReadToEnd, a TimeoutError, if it is not read in `timeout_s`)."""
        reads = self._at_start(name)
        return await read_since(self.settings, self.topics.name(reads.topics[0]), reads.model, since_ms, timeout_s)

    async def ensure_topics(self, topics: list[tuple[str, TopicSpec]]) -> None:
        """This service's own topics (a worker's dispatch topic, a gateway's reply topic) made if missing."""
        await ensure_topics(self.settings, topics)

    def tail(self, name: str, **names: str) -> TopicTail:
        """The declared group-less read from the log's end `name` (a reply topic), not yet started:
        every record written after its start, nothing committed; its owner starts and stops it."""
        return TopicTail(self.settings, self._tail_topic(name, names))

    def _tail_topic(self, name: str, names: dict[str, str]) -> str:
        reads = self.contract.subscription(name)
        binding = Binding(reads, unbound, names=names)
        if reads.group is not None or reads.from_earliest:
            raise ValueError(f"{name!r} is not a group-less read from the log's end")
        [topic] = binding.topic_names(self.topics)
        return topic

    def _at_start(self, name: str) -> Reads:
        reads = self.contract.subscription(name)
        if not reads.at_start or len(reads.topics) != 1:
            raise ValueError(f"{name!r} is not a start-up read of one topic")
        return reads
