"""Gateway settings (env prefix LLMBUS_GATEWAY_)."""

from __future__ import annotations

import re
import socket

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_instance() -> str:
    return "gw-" + re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:60]


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_GATEWAY_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8000
    # Names this instance's reply topic (llm.replies.<instance_id>): keep it stable across restarts.
    instance_id: str = Field(default_factory=_default_instance, pattern=r"^[A-Za-z0-9._-]{1,100}$")
    # Off only on a laptop: every request then belongs to `anonymous_tenant`.
    require_api_key: bool = True
    # A key found in Redis is kept this long: a revoked key works on this instance at most this much longer.
    api_key_cache_s: float = Field(default=5.0, ge=0)
    anonymous_tenant: str = "default"
    # The model name that lets the router's policy choose (OpenAI requires a model in every request).
    auto_model: str = "auto"
    max_body_bytes: int = 4 * 1024 * 1024
    # A client must send a request's headers, then its body, within these (slowloris holds a connection open).
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_in_flight: int = 2048
    # One tenant's share of this instance's slots (beyond it: 429), so one tenant cannot take them all.
    max_in_flight_per_tenant: int = Field(default=512, ge=1)
    # The first chunk may wait for a queue and a cold worker; later chunks come every few ms.
    first_chunk_timeout_s: float = 300.0
    chunk_gap_timeout_s: float = 60.0
    # A worker whose last heartbeat is older than this no longer lists its models.
    worker_stale_s: float = 30.0
