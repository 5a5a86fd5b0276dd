"""How a dispatch ended (llm.outcomes): the placement released, the request retried or answered; the timer's
deadlines, delayed retries and dead workers; a max_attempts error whose attempts are legs of the answer (they
do not count: docs/delivery.md) placed again instead."""

from __future__ import annotations

import logging

from aiokafka.structs import ConsumerRecord

from llmbus.bus import decode
from llmbus.contract.messages import DispatchOutcome, now_ms
from llmbus_services.scheduler.adapters.answers import answer_legs
from llmbus_services.scheduler.core.scheduler import FinalError
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

    async def _placed_again(self, action: FinalError) -> bool:
        """A max_attempts error (`action.gave_up`): True when the request was placed again instead, the attempts
        whose text the answer so far continues (its legs) not counted: those are bounded by the answer's
        migration_limit, which its next worker enforces."""
        gave_up, routed = action.gave_up, action.request.routed
        if gave_up is None or gave_up.failed is None or routed is None:
            return False
        try:
            legs = await answer_legs(self.bus, routed, gave_up.failed.attempt + 1)
        except Exception:  # noqa: BLE001 - unread, every attempt counts: the error goes out as decided
            log.warning("%s: its answer so far could not be read back; max_attempts stands", action.request.key)
            return False
        if not legs:
            return False  # no text the next attempt continues: every attempt counts
        async with self._lock:
            if (actions := self.core.retry_legs(action, legs, now_ms())) is None:
                return False  # still out of attempts: the error stands
            log.info(
                "%s: attempts %s are legs of its answer, not counted; placed again", action.request.key, sorted(legs)
            )
            await self._publish(actions)
        return True
