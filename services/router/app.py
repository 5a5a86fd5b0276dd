"""Router wiring: one consumer loop over llm.requests."""

from __future__ import annotations

import asyncio

from llmbus import topics as t
from llmbus.bus import Bus, ConsumerLoop, make_consumer, stop_consumer
from llmbus.settings import BusSettings
from services.router.config import RouterSettings
from services.router.handlers import RouterHandlers


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    router_settings = RouterSettings()
    bus = await Bus.start(settings, t.ROUTER)
    handlers = RouterHandlers(bus, router_settings)
    consumer = make_consumer(settings, group_id=bus.topics.group(t.ROUTER), client_id="llmbus-router")
    loop = ConsumerLoop(consumer, handlers.on_request, bus.dead_letter, settings, service=t.ROUTER,
                        max_in_flight=router_settings.max_in_flight)
    consumer.subscribe([bus.topics.name(t.REQUESTS)], listener=loop.rebalance_listener())
    await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
    try:
        await loop.run(stop)
    finally:
        await stop_consumer(consumer, settings.stop_timeout_s)
        await bus.stop()
