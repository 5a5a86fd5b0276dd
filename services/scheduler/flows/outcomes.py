"""How a dispatch ended (llm.outcomes): the placement released, the request retried or answered; the timer's
deadlines, delayed retries and dead workers."""

from __future__ import annotations

import logging

from aiokafka.structs import ConsumerRecord

from llmbus.bus import decode
from llmbus.contract.messages import DispatchOutcome, now_ms
from llmbus_services.scheduler.flows.placement import PlacementFlow

log = logging.getLogger(__name__)


class OutcomeFlow(PlacementFlow):
    async def on_outcome(self, record: ConsumerRecord) -> None:
        outcome = decode(record, DispatchOutcome)
        key = outcome.request_key
        try:
            await self.store.release(key, outcome.attempt)
        except Exception:  # the claim expires by itself; the outcome must still be acted on
            log.warning("could not release the claim of %s:%d", outcome.request_id, outcome.attempt, exc_info=True)
        async with self._lock:
            self.pool_stats.on_outcome(self.core.fleet.placement_of(key), now_ms(), outcome)
            await self._publish(
                self.core.on_outcome(
                    key, outcome.attempt, outcome.status, outcome.error, now_ms(), outcome.prompt_tokens
                )
            )

    async def tick(self) -> None:
        async with self._lock:
            await self._publish(self.core.tick(now_ms()))
