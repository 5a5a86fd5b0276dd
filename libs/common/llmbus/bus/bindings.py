"""A declared subscription bound to its handler, and what runs a record through it.

The same path serves the real runtime (llmbus.bus.service, records from a ConsumerLoop) and the
in-memory one (llmbus.bus.memory): a typed handler gets the decoded message (a record that does not
decode raises BadMessage, which goes to llm.dlq with the reason), a `raw` one the record, a batch
one the list of records; a transient failure (Redis or Kafka away, slow, out of memory, read-only
after a failover: llmbus.state.errors) is retried in place with backoff while the record stays
uncommitted, never dead-lettered; a fatal one (credentials, rights) stops the subscription's loop,
the record uncommitted, and with it the service.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka.structs import ConsumerRecord
from prometheus_client import Counter

from llmbus.bus.codec import decode
from llmbus.bus.consumer import ErrorHandler, RevokeHook, StopService
from llmbus.bus.failures import failure_of, transient
from llmbus.bus.holds import Holds
from llmbus.bus.retry_watch import RetryWatch
from llmbus.contract.declarations import Reads
from llmbus.contract.topics import Topics
from llmbus.state.errors import Failure

log = logging.getLogger(__name__)

HANDLER_RETRIES = Counter(
    "llmbus_handler_retries_total", "Handler calls retried after a transient failure", ["service", "topic"]
)
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 5.0

GraceOver = Callable[[], Awaitable[None]]
__all__ = ["Binding", "GraceOver", "handler_for", "transient"]


@dataclass
class Binding:
    """A declared subscription bound to its handler, and how this service runs it.

    `names` fill the declaration's placeholders (`llm.dispatch.<worker_id>`, group `<worker_id>`);
    `pattern` replaces its topics (auth on: every tenant's topic); `on_error` takes a record whose
    handler raised (default: llm.dlq with the reason); `on_revoke` hears of partitions taken away
    before the loop commits them; `drain_grace_s` is how long in-flight records may finish at stop,
    and `grace_over` runs when that is over with records still in flight (they then get
    `stop_timeout_s` more before they are cancelled, uncommitted). `retries` False: the handler
    answers its own failures (the request path: a client is told at once), so a transient one is not
    tried again in place; whatever it raises goes to `on_error`."""

    reads: Reads
    handler: Callable[[Any], Awaitable[object]]
    pattern: str | None = None
    consumer_options: dict[str, object] = field(default_factory=dict)
    holds: Holds[Any] | None = None  # records the handler keeps open after it returns (llmbus.bus.holds)
    names: dict[str, str] = field(default_factory=dict)
    on_error: ErrorHandler | None = None
    on_revoke: RevokeHook | None = None
    drain_grace_s: float | None = None
    grace_over: GraceOver | None = None
    retries: bool = True

    @property
    def name(self) -> str:
        return self.reads.name

    @property
    def batch(self) -> bool:
        return self.reads.batch_max_records is not None

    @property
    def follows(self) -> bool:
        """State every instance reads whole (no group, from the log's start): followed until caught up
        before the service serves, its records applied in order by one consumer with the others'."""
        reads = self.reads
        return reads.group is None and reads.from_earliest and not self.batch and self.pattern is None

    def topic_names(self, topics: Topics) -> list[str]:
        """The full names of the declared topics, placeholders filled (a pattern's are not listed)."""
        names = []
        for topic in self.reads.topics:
            for placeholder, value in self.names.items():
                topic = topic.replace(f"<{placeholder}>", value)
            if "<" not in topic:
                names.append(topics.name(topic))
        return names

    def group_id(self, topics: Topics, service: str) -> str | None:
        return self.reads.group_id(topics, service, **self.names)


def handler_for(
    binding: Binding, service: str, *, max_attempts: int | None, retry_first_s: float, watch: RetryWatch
) -> Callable[[Any], Awaitable[None]]:
    """What the consumer calls for a record (or a batch): decode, handle, retry what is transient.

    `max_attempts`: a transient failure is raised after so many (None: retried until it succeeds or
    the service stops; the in-memory double bounds it, and a test sees it). `watch` sees every record
    in retry-in-place, so one retried forever is noticed (llmbus.bus.retry_watch)."""
    reads, handler = binding.reads, binding.handler
    if not binding.retries and (binding.batch or reads.raw):
        return handler  # type: ignore[return-value]  # its awaitable's value is not used

    async def retried(arg: Any, topic: str) -> None:
        if not binding.retries:
            await handler(arg)
            return
        delay_s = retry_first_s
        attempts = 0
        retry: int | None = None
        try:
            while True:
                try:
                    await handler(arg)
                    return
                except Exception as exc:
                    attempts += 1
                    kind = failure_of(exc)
                    if kind is Failure.FATAL:
                        raise StopService(f"{reads.name} on {topic}: {exc!r}") from exc
                    if kind is not Failure.TRANSIENT or attempts == max_attempts:
                        raise
                    retry = watch.begin(topic) if retry is None else retry
                    watch.check(retry)
                    HANDLER_RETRIES.labels(service, topic).inc()
                    log.warning("%s on %s failed (%r): retrying in %.1fs", reads.name, topic, exc, delay_s)
                    await asyncio.sleep(delay_s)
                    delay_s = min(delay_s * 2, RETRY_MAX_S)
        finally:
            if retry is not None:
                watch.end(retry)

    if binding.batch:

        async def on_batch(records: list[ConsumerRecord]) -> None:
            await retried(records, records[0].topic)

        return on_batch
    if reads.raw:

        async def on_raw(record: ConsumerRecord) -> None:
            await retried(record, record.topic)

        return on_raw
    model = reads.model

    async def on_record(record: ConsumerRecord) -> None:
        await retried(decode(record, model), record.topic)  # BadMessage → the DLQ with its reason

    return on_record
