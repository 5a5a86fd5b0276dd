"""A small Kafka client for llmbus: send a request, stream its chunks, wait for results.

`stream_text` follows the chunk contract on retries (llmbus.contract.chunks.ChunkAssembler); `stream`
yields the raw chunks.

What the CLI, tests and benchmarks use; outside clients can do the same with any Kafka
client (see README: raw JSON onto llm.requests, read the reply topic by request id).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from llmbus.bus import Bus, decode
from llmbus.bus.tail import ReplyRouter, TopicTail
from llmbus.contract import topics as t
from llmbus.contract.chunks import ChunkAssembler, TextUpdate
from llmbus.contract.messages import Feedback, InferenceRequest, InferenceResult, TokenChunk, WorkerState, WorkerStatus
from llmbus.security import tenancy
from llmbus.settings import BusSettings

log = logging.getLogger(__name__)


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
