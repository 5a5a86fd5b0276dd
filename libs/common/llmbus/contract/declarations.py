"""What a service reads and writes, declared once: the runtime subscribes from it, schemagen documents it.

A `Reads` is one subscription (its topic or topics, consumer group, start position, concurrency
within a partition, single records or batches, the message model it decodes); a `Writes` is one
topic a service publishes to. A service's `Contract` holds both. The bus runtime
(llmbus.bus.service) only subscribes through a declared `Reads`, and its publisher records every
topic written, so a test compares what a service really did with what it declared
(`Contract.undeclared`). The AsyncAPI documents and the topic catalog's readers and writers come
from the contracts (llmbus.contract.contracts), never from a list kept beside them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmbus.contract import topics as t
from llmbus.contract.messages import Message


@dataclass(frozen=True)
class Reads:
    """One subscription. `topics` are catalog names (a pattern spec's name such as
    `llm.dispatch.<worker_id>` for a topic named per instance or tenant)."""

    name: str
    topics: tuple[str, ...]
    model: type[Message]
    # None: no group; every instance reads the whole topic and commits nothing (compacted state).
    # "": the service's own group (`<prefix>llmbus.<service>`); else `<prefix>llmbus.<service>.<group>`.
    group: str | None = ""
    from_earliest: bool = True
    max_in_flight: int = 1  # records (or batches) handled at once; commits stay in offset order
    batch_max_records: int | None = None  # a batch handler: the records of one fetch, up to this many
    raw: bool = False  # the handler takes the ConsumerRecord (tombstones, the record's topic, batches)
    at_start: bool = False  # read to its end once as the service starts (ServiceRuntime.read_table), not bound
    # One key's records read on demand, not bound: a lapsed claim's result (llmbus.bus.replies.result_out_since)
    # or a cut answer's chunks (read back to continue it). Declared like any read: the ACLs are generated from it.
    on_demand: bool = False
    notes: str = ""

    @property
    def per_instance(self) -> bool:
        """A group named per instance (`<worker_id>`): one process is its only member."""
        return self.group is not None and "<" in self.group

    def group_id(self, topics: t.Topics, service: str, **names: str) -> str | None:
        """The consumer group; `names` fill the declaration's placeholders (`<worker_id>`: worker_id=…)."""
        if self.group is None:
            return None
        group = self.group
        for name, value in names.items():
            group = group.replace(f"<{name}>", value)
        if "<" in group:
            raise ValueError(f"group {self.group!r} of {service}'s {self.name} needs a value for its placeholder")
        return topics.group(service, group)


@dataclass(frozen=True)
class Writes:
    topic: str
    model: type[Message]
    notes: str = ""


@dataclass(frozen=True)
class Contract:
    service: str
    reads: tuple[Reads, ...] = ()
    writes: tuple[Writes, ...] = ()

    def subscription(self, name: str) -> Reads:
        for reads in self.reads:
            if reads.name == name:
                return reads
        raise KeyError(f"{self.service} declares no subscription {name!r}")

    def group_id(self, name: str, topics: t.Topics, **names: str) -> str | None:
        """The consumer group of the declared subscription `name` (what its consumer must use)."""
        return self.subscription(name).group_id(topics, self.service, **names)

    def bound(self) -> tuple[Reads, ...]:
        """The subscriptions a flow is bound to: all but the start-up reads and the on-demand reads."""
        return tuple(reads for reads in self.reads if not (reads.at_start or reads.on_demand))

    def read_topics(self) -> set[str]:
        return {topic for reads in self.reads for topic in reads.topics}

    def looks_up(self, topic: str) -> bool:
        """Declares reading records of `topic` on demand (a catalog name)."""
        return any(reads.on_demand and topic in reads.topics for reads in self.reads)

    def write_topics(self) -> set[str]:
        return {writes.topic for writes in self.writes}

    def undeclared(self, topics: t.Topics, written: Iterable[str]) -> set[str]:
        """The catalog names of `written` (full topic names) that this contract does not declare."""
        declared = self.write_topics()
        return {name for name in (catalog_name(topics, topic) for topic in written) if name not in declared}


def catalog_name(topics: t.Topics, topic: str) -> str:
    """`llm.dispatch.w-1` under its namespace → `llm.dispatch.<worker_id>`; a catalog topic → its name."""
    try:
        return topics.spec_of(topic).name
    except KeyError:
        return topic.removeprefix(topics.prefix)
