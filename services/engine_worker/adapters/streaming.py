"""Token chunks: batched by time or count, numbered, never one message per token."""

from __future__ import annotations

import asyncio
import logging
import time

from llmbus.bus.producer import Publisher, worth_resending
from llmbus.contract.messages import TokenChunk, ToolCallDelta

log = logging.getLogger(__name__)


class ChunkBatcher:
    """Collects engine deltas; `add` returns a chunk when one is due (pure, clock injected)."""

    def __init__(
        self,
        request_id: str,
        tenant: str,
        interval_ms: float,
        max_tokens: int,
        *,
        model: str,
        shadow: bool = False,
        attempt: int = 1,
        clock=time.monotonic,
    ) -> None:  # type: ignore[no-untyped-def]
        self.request_id = request_id
        self.tenant = tenant
        self.interval_s = interval_ms / 1000
        self.max_tokens = max_tokens
        self.model = model
        self.shadow = shadow
        self.attempt = attempt
        self._clock = clock
        self._text: list[str] = []
        self._calls: list[ToolCallDelta] = []
        self._tokens = 0
        self._opened_at: float | None = None
        self.next_seq = 0

    def add(self, delta: str, tokens: int, tool_calls: list[ToolCallDelta] | None = None) -> TokenChunk | None:
        if not delta and not tokens and not tool_calls:
            return None
        now_s = self._clock()  # once per token: this runs for every token of every request
        if self._opened_at is None:
            self._opened_at = now_s
        self._text.append(delta)
        if tool_calls:
            self._calls += tool_calls
        self._tokens += tokens
        first = self.next_seq == 0  # the first token goes out at once: it is the TTFT
        if first or self._tokens >= self.max_tokens or now_s - self._opened_at >= self.interval_s:
            return self.flush()
        return None

    def flush(self) -> TokenChunk | None:
        if not self._text and not self._calls:
            return None
        chunk = TokenChunk(
            request_id=self.request_id,
            tenant=self.tenant,
            seq=self.next_seq,
            delta="".join(self._text),
            tool_calls=self._calls or None,
            tokens=self._tokens,
            model=self.model,
            shadow=self.shadow,
            attempt=self.attempt,
        )
        self.next_seq += 1
        self._text, self._calls, self._tokens, self._opened_at = [], [], 0, None
        return chunk

    @property
    def last_seq(self) -> int:
        return self.next_seq - 1


class ReplyStream:
    """An attempt's content chunks on its reply topic: sent without waiting for each ack (one key:
    one partition, their order holds), and all acknowledged, or all sent again in order, before
    its final chunk may follow them (`delivered`).

    Through a leader change of the reply topic's partition the chunks wait, as `Publisher.publish`
    does: an enqueue refused while the partition has no leader is tried again for `retry_for_s`,
    and late acks are waited for (the batch is kept), so a stream is not failed, nor sent twice,
    for a failover that outlasts request_timeout_ms."""

    def __init__(self, publisher: Publisher, reply_topic: str, request_id: str, retry_for_s: float) -> None:
        self.publisher = publisher
        self.reply_topic = reply_topic
        self.request_id = request_id
        self.retry_for_s = retry_for_s
        self.chunks: list[TokenChunk] = []
        self._deliveries: list[asyncio.Future[object]] = []

    async def send(self, chunk: TokenChunk) -> None:
        self.chunks.append(chunk)
        delivery = await self.publisher.send(self.reply_topic, chunk, key=self.request_id, retry_for_s=self.retry_for_s)
        self._deliveries.append(delivery)

    async def delivered(self) -> None:
        """Every chunk acknowledged. If the broker refused some for good (or their producer was
        replaced), all are sent again, in order: a reader drops the copies by (attempt, seq), so it
        still takes every seq once and in order."""
        try:
            await self.publisher.delivered(self._deliveries, retry_for_s=self.retry_for_s)
        except Exception as exc:
            if not self.chunks or not worth_resending(exc):
                raise
            log.warning("chunks of %s not all acknowledged (%r): sending them again", self.request_id, exc)
            for chunk in self.chunks:
                await self.publisher.publish(self.reply_topic, chunk, key=self.request_id, retry_for_s=self.retry_for_s)
