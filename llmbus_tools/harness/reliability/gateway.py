"""A gateway in a reliability stack: its tenants' API keys, and the wait until it serves."""

from __future__ import annotations

import asyncio

import httpx

from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client


async def api_keys(settings: BusSettings, tenants: list[str]) -> dict[str, str]:
    """One gateway API key per load tenant (the tenant is the key's, never the body's)."""
    redis = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
    try:
        store = ApiKeyStore(redis, gateway_key_namespace(settings.topic_prefix))
        return {tenant: (await store.create(tenant))[0] for tenant in tenants}
    finally:
        await redis.aclose()


async def wait_ready(base_url: str, timeout_s: float = 120) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with httpx.AsyncClient() as http:
        while loop.time() < deadline:
            try:
                if (await http.get(f"{base_url}/ready", timeout=2)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError(f"gateway at {base_url} not ready within {timeout_s}s")
