"""The result flow: every final result fills the exact (and semantic) cache, feeds the tiers' latency
watch, and answers the coalesced followers of its request."""

from __future__ import annotations

import logging

from aiokafka.structs import ConsumerRecord

from llmbus.bus import decode
from llmbus.contract.messages import (
    InferenceResult,
)
from llmbus_services.router.flows.requests import RequestFlow

log = logging.getLogger(__name__)


class ResultFlow(RequestFlow):
    async def on_result(self, record: ConsumerRecord) -> None:
        result = decode(record, InferenceResult)
        if self.latency is not None:
            self.latency.on_result(result)
        if self.cache is not None and self.settings.cache_fill:
            await self.cache.complete(result)  # first: a request arriving after the leader finished hits the cache
            if self.semantic is not None:
                await self.semantic.complete(result)  # after: it points at the exact entry just stored
        if self.coalesce is not None:
            try:
                await self.coalesce.on_result(result)
            except Exception:  # Redis away: the followers are routed alone once their wait is over
                log.warning("coalesced followers of %s not answered now", result.request_id, exc_info=True)
