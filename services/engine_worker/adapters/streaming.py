"""Token chunks: batched by time or count, numbered, never one message per token."""

from __future__ import annotations

import asyncio
import logging
import time

from llmbus.bus.producer import Publisher, worth_resending
from llmbus.contract.messages import ChoiceDelta, ContinuedFrom, FinishReason, TokenChunk, TokenLogprob, ToolCallDelta
from llmbus_services.engine_worker.core.engine import EngineOutput

log = logging.getLogger(__name__)


class ChunkBatcher:
    """Collects engine deltas; `add` returns a chunk when one is due (pure, clock injected).

    An attempt that continues an earlier one's answer numbers its chunks from where that answer
    stands (`continues.seq`) and marks every chunk with `continues` (docs/delivery.md)."""

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
        continues: ContinuedFrom | None = None,
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
        self._logprobs: list[TokenLogprob] = []
        self._choices: dict[int, ChoiceDelta] = {}  # n > 1: the other choices' parts since the last chunk
        self._tokens = 0
        self._opened_at: float | None = None
        self.continues = continues
        self.first_seq = continues.seq if continues is not None else 0
        self.next_seq = self.first_seq

    def add_output(self, out: EngineOutput) -> TokenChunk | None:
        """One engine output: its text and tool calls, and its log-probabilities and choice where it has them."""
        if out.index == 0 and not out.logprobs:
            return self.add(out.delta, out.new_tokens, out.tool_calls)
        finish = FinishReason(out.finish_reason) if out.index and out.finish_reason else None
        return self.add(out.delta, out.new_tokens, out.tool_calls, out.index, out.logprobs, finish)

    def add(
        self,
        delta: str,
        tokens: int,
        tool_calls: list[ToolCallDelta] | None = None,
        index: int = 0,
        logprobs: list[TokenLogprob] | None = None,
        choice_finish: FinishReason | None = None,
    ) -> TokenChunk | None:
        if not delta and not tokens and not tool_calls and not choice_finish:
            return None
        now_s = self._clock()  # once per token: this runs for every token of every request
        if self._opened_at is None:
            self._opened_at = now_s
        if index == 0:
            self._text.append(delta)
            if tool_calls:
                self._calls += tool_calls
            if logprobs:
                self._logprobs += logprobs
        else:
            part = self._choices.get(index) or self._choices.setdefault(index, ChoiceDelta(index=index))
            part.delta += delta
            if tool_calls:
                part.tool_calls = (part.tool_calls or []) + tool_calls
            if logprobs:
                part.logprobs = (part.logprobs or []) + logprobs
            part.finish_reason = choice_finish or part.finish_reason
        self._tokens += tokens
        first = self.next_seq == self.first_seq  # the first token goes out at once: it is the TTFT
        if first or self._tokens >= self.max_tokens or now_s - self._opened_at >= self.interval_s:
            return self.flush()
        return None

    def flush(self) -> TokenChunk | None:
        if not self._text and not self._calls and not self._choices:
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
            logprobs=self._logprobs or None,
            choices=[self._choices[index] for index in sorted(self._choices)] or None,
            continues=self.continues,
        )
        self.next_seq += 1
        self._text, self._calls, self._tokens, self._opened_at = [], [], 0, None
        self._logprobs, self._choices = [], {}
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
        delivery = await self.publisher.publish(
            self.reply_topic, chunk, key=self.request_id, retry_for_s=self.retry_for_s, wait=False
        )
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
