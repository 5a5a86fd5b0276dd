"""The consumers and ConsumerLoops that run a service's bindings (llmbus.bus.service starts them in phases).

One consumer and loop per subscription, except the followed state: the group-less subscriptions
from the log's start that agree on concurrency and consumer options share one consumer, whose loop
hands each record to its topic's handler (the router's models, experiments and budgets; the
scheduler's fleet), so a service follows its state over one connection and in one order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

from llmbus.bus.bindings import Binding
from llmbus.bus.catch_up import assigned_ends, caught_up, reached, wait_assigned
from llmbus.bus.consumer import ConsumerLoop, ErrorHandler, make_consumer, stop_consumer
from llmbus.bus.runtime import Bus

Handler = Callable[[Any], Awaitable[None]]


@dataclass
class Entry:
    consumer: AIOKafkaConsumer
    loop: ConsumerLoop
    bindings: list[Binding]
    follows: bool
    joins: bool  # placed in its group before the service is ready (from the log's end, or a group per instance)
    ends: dict[TopicPartition, int] | None = None  # followed: where the log ended at the start


class Subscriptions:
    def __init__(self, bus: Bus, bindings: list[Binding], handler_of: Callable[[Binding], Handler]) -> None:
        self.bus = bus
        self.handler_of = handler_of
        follows: dict[tuple[int, tuple[tuple[str, object], ...]], list[Binding]] = {}
        own: list[list[Binding]] = []
        for binding in bindings:
            if binding.follows:
                key = (binding.reads.max_in_flight, tuple(sorted(binding.consumer_options.items())))
                follows.setdefault(key, []).append(binding)
            else:
                own.append([binding])
        self.entries = [self._entry(group) for group in [*follows.values(), *own]]

    async def open(self) -> None:
        """Every consumer started at once (group joins, the slow part of a start, overlap)."""
        timeout_s = self.bus.settings.admin_timeout_s
        started = await asyncio.gather(
            *(asyncio.wait_for(entry.consumer.start(), timeout_s) for entry in self.entries), return_exceptions=True
        )
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome

    async def replay_ends(self) -> dict[TopicPartition, int]:
        """Where each followed partition ended now: records below were written before this start."""
        ends: dict[TopicPartition, int] = {}
        for entry in self.entries:
            if entry.follows:
                entry.ends = await assigned_ends(entry.consumer, self.bus.settings.admin_timeout_s)
                ends.update(entry.ends)
        return ends

    def runs(self, stop: asyncio.Event, *, follows: bool) -> Iterator[tuple[str, Coroutine[Any, Any, None]]]:
        """(name, the loop's run) of the followed loops or of the others."""
        for entry in self.entries:
            if entry.follows == follows:
                yield entry.bindings[0].name, entry.loop.run(stop)

    async def caught_up(self, timeout_s: float) -> bool:
        """True once every followed loop has handled what its log held at the start, within `timeout_s`."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        for entry in self.followed():
            left_s = max(0.0, deadline - asyncio.get_running_loop().time())
            if not await caught_up(entry.consumer, entry.ends or {}, lambda loop=entry.loop: loop.in_flight, left_s):  # type: ignore[misc]
                return False
        return True

    async def caught_up_later(self, stop: asyncio.Event, done: asyncio.Event) -> None:
        """Sets `done` once the followed state is caught up after all (or returns when `stop` is set)."""
        timeout_s = self.bus.settings.admin_timeout_s
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                if all([await reached(e.consumer, e.ends or {}, timeout_s) for e in self.followed()]):
                    done.set()
                    return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    async def joined(self) -> None:
        """The from-latest and per-instance group consumers placed in their groups (bounded): nothing written
        after is missed, and a worker is ready only once it reads its own dispatch topic."""
        for entry in self.entries:
            if entry.joins:
                await wait_assigned(entry.consumer, self.bus.settings.admin_timeout_s)

    def followed(self) -> list[Entry]:
        return [entry for entry in self.entries if entry.follows]

    async def close(self) -> None:
        for entry in self.entries:
            await stop_consumer(entry.consumer, self.bus.settings.stop_timeout_s)

    def _entry(self, bindings: list[Binding]) -> Entry:
        first, bus = bindings[0], self.bus
        settings, service, topics = bus.settings, bus.service, bus.topics
        group_id = first.group_id(topics, service)
        per_instance = first.reads.per_instance and group_id is not None
        # A group named per instance (a worker's dispatch and control) is a static member (KIP-345) under
        # that name: its next process, started after a SIGKILL, is given the partitions at once, where a
        # dynamic member waits for the dead one's session to time out (8 s measured, with 10 s sessions).
        static = {"group_instance_id": group_id} if per_instance else {}
        consumer = make_consumer(
            settings,
            group_id=group_id,
            client_id=f"llmbus-{service}{bus.client_suffix}-{'state' if len(bindings) > 1 else first.name}",
            from_beginning=first.reads.from_earliest,
            **static,
            **first.consumer_options,
        )
        handler, on_error = self._handlers(bindings)
        loop = ConsumerLoop(
            consumer,
            unbound if first.batch else handler,
            on_error,
            settings,
            service=service,
            max_in_flight=first.reads.max_in_flight,
            commit_offsets=group_id is not None,
            drain_grace_s=first.drain_grace_s,
            batch_handler=handler if first.batch else None,
            batch_max_records=first.reads.batch_max_records or 1,
            holds=first.holds,
            on_revoke=first.on_revoke,
            grace_over=first.grace_over,
        )
        listener = loop.rebalance_listener()
        if first.pattern is not None:
            consumer.subscribe(pattern=first.pattern, listener=listener)
        else:
            consumer.subscribe([topic for b in bindings for topic in b.topic_names(topics)], listener=listener)
        # Placed before the service is ready: what comes from the log's end meanwhile would be skipped, and
        # a worker said ready before its own dispatch partition is assigned would be sent work it cannot read.
        joins = (not first.reads.from_earliest and group_id is not None) or per_instance
        return Entry(consumer, loop, bindings, first.follows, joins)

    def _handlers(self, bindings: list[Binding]) -> tuple[Handler, ErrorHandler]:
        """The handler and error path of one binding, or of several by the record's topic."""
        if len(bindings) == 1:
            return self.handler_of(bindings[0]), bindings[0].on_error or self.bus.dead_letter
        topics = self.bus.topics
        by_topic = {topic: self.handler_of(b) for b in bindings for topic in b.topic_names(topics)}
        errors = {topic: b.on_error or self.bus.dead_letter for b in bindings for topic in b.topic_names(topics)}

        async def handler(record: ConsumerRecord) -> None:
            await by_topic[record.topic](record)

        async def on_error(record: ConsumerRecord, exc: Exception) -> None:
            await errors[record.topic](record, exc)

        return handler, on_error


async def unbound(record: ConsumerRecord) -> None:
    raise RuntimeError("no handler takes this record alone (a batch subscription's go to its batch handler)")
