"""The gateway's side of the bus: send a request, follow this instance's reply topic, cancel.

Replies come through llmbus.bus.tail's ReplyRouter (one group-less tail of the instance's
reply topic, chunks handed to their request's queue); llmbus.contract.chunks applies the chunk
contract on retries: the ChunkAssembler keeps the current attempt's text, and `unshown` hands
the client each character once (a client of an HTTP stream cannot take text back).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from aiokafka.structs import ConsumerRecord
from opentelemetry import trace

from llmbus.bus import BadMessage, Bus
from llmbus.bus.tail import ReplyRouter, TopicTail
from llmbus.contract import semconv as sc
from llmbus.contract import topics as t
from llmbus.contract.chunks import ChunkAssembler, ShownChoice, unshown, unshown_tool_calls
from llmbus.contract.messages import (
    Control,
    ControlAction,
    ErrorCode,
    ErrorInfo,
    InferenceRequest,
    TokenChunk,
    TokenLogprob,
    ToolCallDelta,
)
from llmbus_services.gateway.core.translate import ChoiceOut, finish_reason

log = logging.getLogger(__name__)


class Exchange:
    """One request in flight: its accepted chunks in order, and a cancel if it is left unfinished."""

    def __init__(self, relay: Relay, request: InferenceRequest, queue: asyncio.Queue[TokenChunk]) -> None:
        self.relay = relay
        self.request = request
        self.queue = queue
        self.assembler = ChunkAssembler()
        self.shown = ""  # what went out to the client so far
        self.shown_calls: list[ToolCallDelta] = []  # the tool call fragments that went out so far
        self.shown_logprobs = 0  # log-probabilities of the text that went out so far
        self.shown_choices: dict[int, ShownChoice] = {}  # the other choices (n > 1): what went out of each
        self.model: str | None = None  # the model that answers (the router may have chosen it)
        self.closed = False
        self.span: trace.Span = trace.INVALID_SPAN  # the HTTP request's server span, ended on close

    async def next_chunk(self, timeout_s: float) -> TokenChunk:
        """The next chunk that counts (stale attempts and repeats skipped); TimeoutError after timeout_s."""
        async with asyncio.timeout(timeout_s):  # one deadline for the chunks skipped too; no task per wait
            while True:
                chunk = await self.queue.get()
                if self.assembler.add(chunk) is not None:
                    self.model = chunk.model or self.model
                    return chunk

    def unseen(self) -> str:
        """The current attempt's text not shown yet, now marked shown; RetryDiverged if it cannot continue."""
        delta = unshown(self.assembler.text, self.shown)
        self.shown += delta
        return delta

    def unseen_tool_calls(self) -> list[ToolCallDelta]:
        """`unseen` for the current attempt's tool call fragments."""
        calls = unshown_tool_calls(self.assembler.tool_calls, self.shown_calls)
        self.shown_calls += calls
        return calls

    def unseen_logprobs(self) -> list[TokenLogprob]:
        """The current attempt's log-probabilities past those already sent (they follow the text's tokens)."""
        logprobs = self.assembler.logprobs[self.shown_logprobs :]
        self.shown_logprobs += len(logprobs)
        return logprobs

    def unseen_choices(self) -> list[ChoiceOut]:
        """What the other choices (n > 1) have that was not sent yet, each ending once with its finish reason."""
        out = []
        for index, parts in sorted(self.assembler.choices.items()):
            update = self.shown_choices.setdefault(index, ShownChoice()).take(parts)
            if update is not None:
                text, calls, logprobs, ended = update
                out.append(ChoiceOut(index, text, calls or None, logprobs, finish_reason(ended) if ended else None))
        return out

    @property
    def finished(self) -> bool:
        return self.assembler.done

    def close(self, reason: str = "client went away") -> None:
        """Stop listening; an unfinished request is cancelled through llm.control."""
        if self.closed:
            return
        self.closed = True
        self.relay.forget(self)
        if not self.finished:
            self.relay.cancel_later(self.request, reason)
        self._end_span()

    def _end_span(self) -> None:
        final = self.assembler.final
        if self.span.is_recording():
            attributes: dict[str, str | int | list[str]] = {sc.LLMBUS_ATTEMPT: self.assembler.attempt}
            if self.model:
                attributes[sc.GEN_AI_RESPONSE_MODEL] = self.model
            if final is None:
                attributes[sc.ERROR_TYPE] = "client_disconnected"
            elif final.error is not None:
                attributes[sc.ERROR_TYPE] = str(final.error.code)
            else:
                attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [str(final.finish_reason or "stop")]
                if final.usage is not None:
                    attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = final.usage.prompt_tokens
                    attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = final.usage.completion_tokens
            self.span.set_attributes(attributes)
        self.span.end()


# Past every real chunk: the ending is accepted whatever the request's attempts have sent.
_ENDING_SEQ = 2**31 - 1


def _ending(key: bytes, reason: str) -> TokenChunk:
    """A final error chunk the gateway makes itself for a request whose reply it cannot read."""
    error = ErrorInfo(code=ErrorCode.INTERNAL, message=reason[:2000], retryable=True, retry_after_ms=1000)
    request_id = key.decode(errors="replace")
    return TokenChunk(request_id=request_id, tenant="", seq=_ENDING_SEQ, final=True, error=error, attempt=0)


class Relay:
    def __init__(self, bus: Bus, replies: ReplyRouter, reply_topic_base: str) -> None:
        self.bus = bus
        self.replies = replies
        self.reply_topic_base = reply_topic_base  # what requests name; the tail reads it in the namespace
        self.in_flight = 0
        self._in_flight_by_tenant: collections.Counter[str] = collections.Counter()
        self._cancels: set[asyncio.Future[object]] = set()  # and dead letters: sends the caller must not wait on

    @classmethod
    async def start(cls, bus: Bus, tail: TopicTail, instance_id: str) -> Relay:
        """Over `tail`, this instance's reply topic from its end (started here)."""
        relay = cls(bus, ReplyRouter(await tail.start()), t.replies_base(instance_id))
        relay.replies.on_bad = relay.on_bad_chunk
        relay.replies.on_tail_lost = relay._tail_lost
        return relay

    def in_flight_of(self, tenant: str) -> int:
        return self._in_flight_by_tenant[tenant]

    def healthy(self) -> bool:
        """The reply tail reads now (False from a failure of it until it runs again)."""
        return self.replies.live

    async def on_bad_chunk(self, record: ConsumerRecord, bad: BadMessage) -> None:
        """The record to llm.dlq; its request ends now with an error (its text has a hole), not after 300 s.

        The dead letter goes out in its own task: through a broker outage it is retried for a while,
        and every other stream waits on the reply tail meanwhile."""
        queue = self.replies.queues.get(record.key) if record.key is not None else None
        if queue is not None:
            queue.put_nowait(_ending(record.key, f"a reply chunk could not be read: {bad.reason}"))
        self._in_background(self._dead_letter(record, bad))

    async def _dead_letter(self, record: ConsumerRecord, bad: BadMessage) -> None:
        try:
            await self.bus.send_dead_letter(record, bad.code, bad.reason, bad.request_id)
        except Exception:
            log.exception("could not dead-letter the chunk at %s@%d", record.topic, record.offset)

    def _tail_lost(self, exc: BaseException) -> None:
        """The reply tail failed: /ready answers 503 until it runs again (ReplyRouter restarts it with
        backoff), and every waiting request ends now: its chunks may come while nothing reads."""
        log.error("the reply tail failed (%r); not ready until it runs again", exc)
        for key, queue in list(self.replies.queues.items()):
            queue.put_nowait(_ending(key, "this gateway lost its reply stream"))

    async def open(self, request: InferenceRequest, span: trace.Span = trace.INVALID_SPAN) -> Exchange:
        """Listen for the request's chunks, then publish it (so not even the first chunk is missed).

        The request goes out inside `span`: its traceparent makes every later hop part of the trace.
        """
        key = request.request_id.encode()
        queue: asyncio.Queue[TokenChunk] = asyncio.Queue()
        self.replies.queues[key] = queue
        exchange = Exchange(self, request, queue)
        exchange.span = span
        self.in_flight += 1
        self._in_flight_by_tenant[request.tenant] += 1
        try:
            with trace.use_span(span, end_on_exit=False):
                await self.bus.publisher.publish(
                    self.bus.topics.name(t.REQUESTS), request, key=request.session_id or request.request_id
                )
        except BaseException:
            exchange.closed = True
            self.forget(exchange)
            span.end()
            raise
        return exchange

    def forget(self, exchange: Exchange) -> None:
        self.replies.queues.pop(exchange.request.request_id.encode(), None)
        self.in_flight -= 1
        tenant = exchange.request.tenant
        self._in_flight_by_tenant[tenant] -= 1
        if self._in_flight_by_tenant[tenant] <= 0:  # a tenant with none in flight takes no memory
            del self._in_flight_by_tenant[tenant]

    def cancel_later(self, request: InferenceRequest, reason: str) -> None:
        """Publish the cancel in its own task: the caller may be a response being torn down."""
        self._in_background(self._cancel(request, reason))

    def _in_background(self, send: Coroutine[Any, Any, object]) -> None:
        task = asyncio.ensure_future(send)
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _cancel(self, request: InferenceRequest, reason: str) -> None:
        # By its request key (tenant and request id): a cancel stops this tenant's request only.
        control = Control(action=ControlAction.CANCEL, target_id=request.request_key, reason=reason)
        request_id = request.request_id
        try:
            await self.bus.publisher.publish(
                self.bus.topics.name(t.CONTROL),
                control,
                key=control.target_id,
                request_id=request_id,
                tenant=request.tenant,
            )
            log.info("cancelled %s: %s", request_id, reason)
        except Exception:
            log.exception("could not cancel %s", request_id)

    async def stop(self) -> None:
        if self._cancels:
            await asyncio.wait(self._cancels, timeout=self.bus.settings.send_timeout_s)
        with contextlib.suppress(Exception):
            await self.replies.stop()
