"""Router handlers: decode → route (core) → publish. Bad input ends as DLQ + final error."""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from llmbus import topics as t
from llmbus.bus import BadMessage, Bus, decode
from llmbus.bus.dlq import send_to_dlq
from llmbus.messages import ErrorInfo, InferenceRequest, now_ms
from llmbus.replies import publish_error, reply_topic_of
from services.router.config import RouterSettings
from services.router.core.route import Rejected, check_reply_topic, route


class RouterHandlers:
    def __init__(self, bus: Bus, settings: RouterSettings) -> None:
        self.bus = bus
        self.settings = settings
        self.routed_topic = bus.topics.name(t.ROUTED)

    async def on_request(self, record: ConsumerRecord) -> None:
        received_at_ms = now_ms()
        try:
            request = decode(record, InferenceRequest)
            check_reply_topic(request, self.settings.allowed_reply_topic_prefix)
        except BadMessage as bad:
            await self._reject_bad(record, bad)
            return
        except Rejected as rejected:
            await self._reject_bad(record, BadMessage(rejected.code, rejected.reason, request.request_id, request.tenant))
            return
        routed = route(request, self.settings.default_model, received_at_ms)
        await self.bus.publisher.publish(self.routed_topic, routed, key=routed.model, request_id=request.request_id,
                                         tenant=request.tenant)

    async def _reject_bad(self, record: ConsumerRecord, bad: BadMessage) -> None:
        await send_to_dlq(self.bus.publisher, self.bus.topics, record, bad.code, bad.reason, self.bus.service,
                          bad.request_id)
        if bad.request_id is None:
            return  # nobody to answer: the DLQ entry is the only trace
        await publish_error(
            self.bus.publisher,
            self.bus.topics,
            request_id=bad.request_id,
            tenant=bad.tenant or "default",
            error=ErrorInfo.of(bad.code, bad.reason),
            produced_by=self.bus.service,
            reply_topic=reply_topic_of(self.bus.topics, None),
        )
