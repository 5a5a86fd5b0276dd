"""Gateway wiring: the bus, this instance's reply topic, the model catalog, API keys, the HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import uvicorn

from llmbus.bus.service import ServiceRuntime
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_services.gateway.adapters.catalog import ModelCatalog
from llmbus_services.gateway.adapters.relay import Relay
from llmbus_services.gateway.adapters.server import server_config
from llmbus_services.gateway.config import GatewaySettings
from llmbus_services.gateway.flows import Gateway, create_app

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: run_service's stop event ends it, like every service."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:  # uvicorn before 0.29
        pass


def follow_catalog(runtime: ServiceRuntime, gw: GatewaySettings) -> ModelCatalog:
    """What GET /v1/models lists: llm.models and llm.workers followed (caught up before the HTTP server)."""
    catalog = ModelCatalog(gw.worker_stale_s)
    runtime.subscribe("models", catalog.on_model)
    runtime.subscribe("workers", catalog.on_worker)
    return catalog


async def build(runtime: ServiceRuntime, gw: GatewaySettings) -> Gateway:
    """This instance's reply relay, the model catalog followed from llm.models and llm.workers, API keys,
    and the HTTP server, served once the catalog is caught up (llmbus.contract.contracts.GATEWAY)."""
    settings, bus = runtime.settings, runtime.bus
    await runtime.ensure_topics([(runtime.topics.replies(gw.instance_id), t.REPLIES_SPEC)])
    relay = await Relay.start(bus, runtime.tail("replies", instance=gw.instance_id), gw.instance_id)
    runtime.on_stop(relay.stop)
    catalog = follow_catalog(runtime, gw)
    keys = None
    if gw.require_api_key:
        redis = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
        runtime.on_stop(redis.aclose)
        keys = ApiKeyStore(redis, gateway_key_namespace(settings.topic_prefix))
    else:
        log.warning("API keys are off: every request belongs to tenant %r", gw.anonymous_tenant)
    gateway = Gateway(gw, relay, keys, catalog, runtime.caught_up)
    server = _Server(server_config(create_app(gateway), gw, settings.stop_timeout_s))

    async def serve_http(stop: asyncio.Event) -> None:
        serving = asyncio.create_task(server.serve())
        stopping = asyncio.create_task(stop.wait())
        log.info("gateway %s on http://%s:%d", gw.instance_id, gw.host, gw.port)
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True  # finish the open streams (bounded), then return
        stopping.cancel()
        await serving
        if not stop.is_set():
            raise RuntimeError("the HTTP server stopped")

    runtime.task("http", serve_http)
    return gateway


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    gw = GatewaySettings()
    suffix = f"-{gw.instance_id}"
    await ServiceRuntime.serve(settings, contracts.GATEWAY, lambda rt: build(rt, gw), stop, client_suffix=suffix)
