"""A routed request: submitted to the core, its record held open until it is placed or answered.

A request that must wait keeps its handler (and so its offset) open until it is placed or
answered, so a crash never loses a queued request. When the partition is revoked (a rebalance),
what still waits here is handed over: dropped from the core and its handler cancelled,
uncommitted, so the new owner reads it again.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from opentelemetry import trace

from llmbus.bus import BadMessage, decode
from llmbus.contract.messages import RoutedRequest, now_ms
from llmbus_services.scheduler.core.scheduler import FinalError
from llmbus_services.scheduler.core.types import SchedRequest
from llmbus_services.scheduler.flows.placement import PlacementFlow, internal_error

log = logging.getLogger(__name__)


class RoutedFlow(PlacementFlow):
    async def on_routed(self, record: ConsumerRecord) -> None:
        routed = decode(record, RoutedRequest)
        spec = self.core.model_specs.get(routed.model)
        request = SchedRequest.from_routed(
            routed,
            now_ms(),
            self.settings.prefix_block_tokens,
            self.settings.max_prefix_blocks,
            spec.tokenizer if spec is not None else None,
        )
        rid = request.key
        restored = self.core.fleet.placement_of(rid)
        if restored is not None and rid in self._restored:
            self._restored.discard(rid)
            # Placed before a restart (the placement came from Redis) and its record redelivered:
            # the scheduler may have died between the claim and the Dispatch, so send it again.
            # The worker drops a Dispatch for a request it is running or has finished.
            await self._send(restored.worker_id, routed, restored.attempt, restored.request)
            return
        self.pool_stats.on_arrival(request.model, now_ms(), routed.release, prompt_tokens=request.prompt_tokens)
        answered = self._answered.setdefault(rid, asyncio.get_running_loop().create_future())
        self._source[rid] = TopicPartition(record.topic, record.partition)
        # Placed later from the queue (timer or another record's handler), its Dispatch still
        # belongs to this record's trace: this handler's span stays open until it is answered.
        self._spans[rid] = trace.get_current_span()
        try:
            async with self._lock:
                await self._publish(self.core.submit(request, now_ms()))
            on_its_way = rid in self._delivering or rid in self._answering  # resolved when it is through
            if not self.core.queues.holds(request.model, rid) and not on_its_way:
                self._resolve(rid)  # answered, or already placed before a restart (a Dispatch on its way resolves it)
            await answered  # cancelled by a hand-over: the record stays uncommitted for the new owner
        finally:
            self._source.pop(rid, None)
            if not answered.done():  # failed before it was placed or answered: no waiter is left behind
                self._resolve(rid)

    async def on_routed_error(self, record: ConsumerRecord, exc: Exception) -> None:
        """A routed record whose handling failed: the DLQ entry, and the client's final error."""
        await self.bus.dead_letter(record, exc)
        try:
            routed = decode(record, RoutedRequest)
        except BadMessage:
            return  # the router wrote it: nothing to answer that it did not already
        request = SchedRequest.from_routed(routed, now_ms(), self.settings.prefix_block_tokens, 0)
        self._resolve(request.key)
        await self._fail(FinalError(request, internal_error(exc)))

    def hand_over(self, revoked: set[TopicPartition]) -> int:
        """Partitions of llm.routed taken from us: what still waits here for them is dropped and its
        handler cancelled (uncommitted), so the new owner alone places or answers it."""
        handed = 0
        for rid, tp in list(self._source.items()):
            if tp not in revoked or self.core.cancel(rid) is None:
                continue  # another partition's, or placed already (its outcome is handled by any instance)
            self._source.pop(rid, None)
            future = self._answered.pop(rid, None)
            if future is not None and not future.done():
                future.cancel()
            handed += 1
        if handed:
            log.info("handed over %d waiting requests of revoked partitions %s", handed, sorted(map(str, revoked)))
        return handed
