"""A small Kafka client for llmbus: send a request, stream its chunks, wait for results.

`stream_text` follows the chunk contract on retries (llmbus.contract.chunks.ChunkAssembler); `stream`
yields the raw chunks.

What the CLI, tests and benchmarks use; outside clients can do the same with any Kafka
client (see README: raw JSON onto llm.requests, read the reply topic by request id).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord

from llmbus.bus import BadMessage, Bus, decode
from llmbus.bus.catch_up import wait_assigned
from llmbus.bus.security import kafka_auth
from llmbus.contract import topics as t
from llmbus.contract.chunks import ChunkAssembler, TextUpdate
from llmbus.contract.messages import Feedback, InferenceRequest, InferenceResult, TokenChunk, WorkerState, WorkerStatus
from llmbus.security import tenancy
from llmbus.settings import BusSettings

log = logging.getLogger(__name__)


class TopicTail:
    """Reads a topic from its end (as of `start`), group-less: sees only what comes after."""

    def __init__(self, settings: BusSettings, topic: str) -> None:
        self.settings = settings
        self.topic = topic
        # Group-less subscription: aiokafka assigns every partition of the topic itself.
        self.consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="latest",
            request_timeout_ms=settings.request_timeout_ms,
            metadata_max_age_ms=settings.metadata_max_age_ms,
            **kafka_auth(settings),
        )

    async def start(self) -> TopicTail:
        """Started and positioned at the end; if any step fails the consumer is stopped, not left open."""
        try:
            return await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> TopicTail:
        await asyncio.wait_for(self.consumer.start(), self.settings.admin_timeout_s)
        try:  # positions resolved (at the end: offset reset latest), so nothing produced after start() is missed
            await wait_assigned(self.consumer, self.settings.admin_timeout_s)
        except TimeoutError:
            raise LookupError(f"topic {self.topic} has no partitions (does it exist?)") from None
        return self

    async def records(self, timeout_s: float) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (remaining := deadline - loop.time()) > 0:
            batches = await self.consumer.getmany(timeout_ms=int(min(remaining, 0.2) * 1000))
            for records in batches.values():
                for record in records:
                    yield record  # type: ignore[misc]

    async def stop(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.consumer.stop(), self.settings.stop_timeout_s)


OnBadChunk = Callable[[ConsumerRecord, BadMessage], Awaitable[None]]


class ReplyRouter:
    """One tail of a reply topic shared by every stream of a client: chunks go to their request's queue.

    A record that does not decode (a newer schema during a rolling upgrade, a stray writer) goes to
    `on_bad` and the tail goes on: one bad record must not end the only task every stream waits on.
    """

    def __init__(self, tail: TopicTail, on_bad: OnBadChunk | None = None) -> None:
        self.tail = tail
        self.queues: dict[bytes, asyncio.Queue[TokenChunk]] = {}
        self.on_bad = on_bad
        self.task = asyncio.create_task(self._route())

    async def _route(self) -> None:
        while True:
            async for record in self.tail.records(3600):
                queue = self.queues.get(record.key)  # type: ignore[attr-defined]
                if queue is None:
                    continue
                try:
                    chunk = decode(record, TokenChunk)  # type: ignore[arg-type]
                except BadMessage as bad:
                    await self._bad(record, bad)  # type: ignore[arg-type]
                    continue
                queue.put_nowait(chunk)

    async def _bad(self, record: ConsumerRecord, bad: BadMessage) -> None:
        log.warning("undecodable chunk on %s[%d]@%d: %s", record.topic, record.partition, record.offset, bad.reason)
        if self.on_bad is None:
            return
        try:
            await self.on_bad(record, bad)
        except Exception:  # the dead letter is best effort; the tail is what every stream needs
            log.exception("could not hand on the undecodable chunk at %s@%d", record.topic, record.offset)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.tail.stop()


class LlmbusClient:
    def __init__(self, settings: BusSettings | None = None) -> None:
        self.settings = settings or BusSettings()
        self.topics = t.Topics(self.settings.topic_prefix)
        self._bus: Bus | None = None
        self._replies: dict[str, ReplyRouter] = {}
        # Streams started together must share one tail per reply topic: without the lock each
        # started its own and all but the last were never stopped (7 unclosed consumers per CI run).
        self._replies_lock = asyncio.Lock()

    async def __aenter__(self) -> LlmbusClient:
        self._bus = await Bus.start(self.settings, t.CLIENT)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for router in self._replies.values():
            await router.stop()
        if self._bus is not None:
            await self._bus.stop()

    def _tenant(self) -> str | None:
        """The tenant this client is authenticated as; None in dev mode and for services and operators."""
        return tenancy.tenant_of_principal(self.settings.kafka_sasl_username) if self.settings.auth_enabled else None

    def addressed(self, request: InferenceRequest) -> tuple[str, InferenceRequest]:
        """(request topic, request): with auth on, a tenant writes its own topic and gets its own replies."""
        tenant = self._tenant()
        if tenant is None:
            return self.topics.name(t.REQUESTS), request
        update = {"tenant": tenant} if request.tenant == "default" else {}
        if request.reply_topic == t.TOKENS:
            update["reply_topic"] = tenancy.tenant_reply_topic(tenant)
        return self.topics.name(tenancy.request_topic(tenant)), request.model_copy(update=update)

    async def send(self, request: InferenceRequest) -> None:
        assert self._bus is not None
        topic, request = self.addressed(request)
        await self._bus.publisher.publish(topic, request, key=request.session_id or request.request_id)

    def feedback_addressed(self, feedback: Feedback) -> tuple[str, Feedback]:
        """(feedback topic, feedback): with auth on, a tenant writes its own `llm.feedback.<tenant>`."""
        tenant = self._tenant()
        if tenant is None:
            return self.topics.name(t.FEEDBACK), feedback
        update = {"tenant": tenant} if feedback.tenant == "default" else {}
        return self.topics.name(tenancy.feedback_topic(tenant)), feedback.model_copy(update=update)

    async def send_feedback(self, feedback: Feedback) -> None:
        """The user's score of an answer; it counts only on a request of the same tenant."""
        assert self._bus is not None
        topic, feedback = self.feedback_addressed(feedback)
        await self._bus.publisher.publish(topic, feedback, key=feedback.request_id, request_id=feedback.request_id)

    async def _reply_router(self, reply_topic: str) -> ReplyRouter:
        async with self._replies_lock:
            if reply_topic not in self._replies:
                self._replies[reply_topic] = ReplyRouter(await TopicTail(self.settings, reply_topic).start())
            return self._replies[reply_topic]

    async def stream(self, request: InferenceRequest, timeout_s: float = 120.0) -> AsyncIterator[TokenChunk]:
        """Send `request` and yield its chunks in arrival order until the final one."""
        _, request = self.addressed(request)
        router = await self._reply_router(self.topics.name(request.reply_topic))
        key = request.request_id.encode()
        queue: asyncio.Queue[TokenChunk] = asyncio.Queue()
        router.queues[key] = queue
        try:
            await self.send(request)
            deadline = asyncio.get_running_loop().time() + timeout_s
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                try:
                    chunk = await asyncio.wait_for(queue.get(), max(remaining, 0))
                except TimeoutError:
                    raise TimeoutError(f"no final chunk for {request.request_id} within {timeout_s}s") from None
                yield chunk
                if chunk.final:
                    return
        finally:
            router.queues.pop(key, None)

    async def stream_text(self, request: InferenceRequest, timeout_s: float = 120.0) -> AsyncIterator[TextUpdate]:
        """`stream` with the chunk contract applied (see llmbus.contract.chunks): stale and repeated chunks are
        dropped, and an update with `restarted` says the text shown so far is void (a retry began)."""
        assembler = ChunkAssembler()
        async for chunk in self.stream(request, timeout_s):
            if (update := assembler.add(chunk)) is not None:
                yield update


async def collect_results(
    settings: BusSettings,
    request_ids: set[str],
    timeout_s: float,
    tail: TopicTail | None = None,
    until: Callable[[dict[str, list[InferenceResult]]], bool] | None = None,
) -> dict[str, list[InferenceResult]]:
    """Every result published for `request_ids` (after the tail's start) within timeout_s, or until
    `until(found)` holds: for example once every request has one, or once a sentinel request sent
    after them has come through the same services (a duplicate would have come before it)."""
    topics = t.Topics(settings.topic_prefix)
    own_tail = tail is None
    tail = tail or await TopicTail(settings, topics.name(t.RESULTS)).start()
    found: dict[str, list[InferenceResult]] = {}
    try:
        async for record in tail.records(timeout_s):
            result = decode(record, InferenceResult)  # type: ignore[arg-type]
            if result.request_id in request_ids:
                found.setdefault(result.request_id, []).append(result)
                if until is not None and until(found):
                    break
    finally:
        if own_tail:
            await tail.stop()
    return found


async def ready_workers(settings: BusSettings, enough: Callable[[set[str]], bool], timeout_s: float) -> set[str]:
    """Worker ids whose heartbeat said ready (from now on) until `enough(ids)` or the time is up."""
    tail = await TopicTail(settings, t.Topics(settings.topic_prefix).name(t.WORKERS)).start()
    ready: set[str] = set()
    try:
        async for record in tail.records(timeout_s):
            status = decode(record, WorkerStatus)  # type: ignore[arg-type]
            if status.state == WorkerState.READY:
                ready.add(status.worker_id)
            if enough(ready):
                break
    finally:
        await tail.stop()
    return ready
