"""How a dispatch ended (llm.outcomes): the placement released, the request retried or answered; the timer's
deadlines, delayed retries and dead workers; a max_attempts error after a lost worker checked against the
start markers (a retry its worker never started does not count: docs/delivery.md)."""

from __future__ import annotations

import logging

from aiokafka.structs import ConsumerRecord

from llmbus.bus import decode
from llmbus.contract.messages import DispatchOutcome, now_ms
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
        """A max_attempts error whose last attempt was lost with its worker (`action.lost`): the request is placed
        again instead when retries lost before their workers started them leave it an attempt."""
        if action.lost is None:
            return False
        key = action.request.key
        try:
            started = await self.fence.started_attempts(key)
        except Exception:  # noqa: BLE001 - Redis away: every attempt counts, as before it was asked
            log.warning("start markers of %s unreadable; its %s error stands", key, action.error.code.value)
            return False
        unstarted = set(range(2, action.lost.attempt + 1)) - started  # first attempts are not marked
        if not unstarted:
            return False
        async with self._lock:
            actions = self.core.retry_unstarted(action.lost, unstarted, now_ms())
            if actions is None:
                return False  # still out of attempts: the error stands
            log.info("%s: attempts %s lost before their workers started them; placed again", key, sorted(unstarted))
            await self._publish(actions)
        return True
