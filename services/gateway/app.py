"""Gateway wiring: the bus, this instance's reply topic, the model catalog, API keys, the HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import uvicorn

from llmbus.bus import Bus
from llmbus.bus.admin import ensure_topics
from llmbus.contract import topics as t
from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_services.gateway.adapters.catalog import CatalogFollower, ModelCatalog
from llmbus_services.gateway.adapters.relay import Relay
from llmbus_services.gateway.adapters.server import server_config
from llmbus_services.gateway.config import GatewaySettings
from llmbus_services.gateway.handlers import Gateway, create_app

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: run_service's stop event ends it, like every service."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:  # uvicorn before 0.29
        pass


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    gw_settings = GatewaySettings()
    bus = await Bus.start(settings, t.GATEWAY, client_suffix=f"-{gw_settings.instance_id}")
    await ensure_topics(settings, [(bus.topics.replies(gw_settings.instance_id), t.REPLIES_SPEC)])
    relay = await Relay.start(bus, gw_settings.instance_id)
    catalog = ModelCatalog(gw_settings.worker_stale_s)
    follower = CatalogFollower(settings, catalog, bus.dead_letter)
    redis = (
        redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
        if gw_settings.require_api_key
        else None
    )
    keys = ApiKeyStore(redis, gateway_key_namespace(settings.topic_prefix)) if redis is not None else None
    if keys is None:
        log.warning("API keys are off: every request belongs to tenant %r", gw_settings.anonymous_tenant)
    app = create_app(Gateway(gw_settings, relay, keys, catalog, follower))
    server = _Server(server_config(app, gw_settings, settings.stop_timeout_s))
    try:
        await follower.start()
        serving = asyncio.create_task(server.serve())
        stopping = asyncio.create_task(stop.wait())
        log.info("gateway %s on http://%s:%d", gw_settings.instance_id, gw_settings.host, gw_settings.port)
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True  # finish the open streams (bounded), then return
        stopping.cancel()
        await serving
    finally:
        await follower.stop()
        await relay.stop()
        if redis is not None:
            await redis.aclose()
        await bus.stop()
