"""The baseline for bench.router_bench: the same Kafka hops as the router, and no routing at all.

It consumes llm.requests with the same consumer loop and producer settings as the router,
decodes each request, wraps it in a RoutedRequest for the model it names and publishes it
on llm.routed. What the real router takes beyond this is what routing adds.

    python -m bench.router_null_forwarder   (LLMBUS_* settings as for any service)
"""

from __future__ import annotations

import asyncio

from aiokafka.structs import ConsumerRecord

from llmbus.bus import Bus, ConsumerLoop, decode, make_consumer, run_service, stop_consumer
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceRequest, RoutedRequest, now_ms
from llmbus.settings import BusSettings

SERVICE = "router-null"


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    bus = await Bus.start(settings, SERVICE)
    routed_topic = bus.topics.name(t.ROUTED)

    async def forward(record: ConsumerRecord) -> None:
        received_at_ms = now_ms()
        request = decode(record, InferenceRequest)
        routed = RoutedRequest(
            request=request, model=request.model or "none", route_reason="null", received_at_ms=received_at_ms
        )
        await bus.publisher.publish(
            routed_topic, routed, key=routed.model, request_id=request.request_id, tenant=request.tenant
        )

    consumer = make_consumer(settings, group_id=bus.topics.group(SERVICE), client_id="llmbus-router-null")
    loop = ConsumerLoop(consumer, forward, bus.dead_letter, settings, service=SERVICE, max_in_flight=512)
    consumer.subscribe([bus.topics.name(t.REQUESTS)], listener=loop.rebalance_listener())
    await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
    try:
        await loop.run(stop)
    finally:
        await stop_consumer(consumer, settings.stop_timeout_s)
        await bus.stop()


if __name__ == "__main__":
    run_service(SERVICE, main)
