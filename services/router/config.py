"""Router settings (env prefix LLMBUS_ROUTER_)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class RouterSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_ROUTER_", extra="ignore")

    # The routing policy (YAML); None: services/router/policies/default.yaml (the seed's tiers).
    policy_path: str | None = None
    # Key of the HMAC-SHA256 that hashes user ids on results and costs for tenants whose policy says
    # hash_user_ids; the same per deployment, so one user keeps one value across restarts and replicas.
    user_id_salt: SecretStr | None = None
    # Dev override of the policy's default target (e.g. "sim-llama-8b" on a stack with only sim workers).
    default_model: str | None = None
    max_in_flight: int = 512
    allowed_reply_topic_prefix: str = "llm."  # dev mode: reply topics must live in the llm.* namespace
    # Auth on: how soon a new tenant's request topic (llm.requests.<tenant>) is picked up by pattern.
    request_topic_discovery_ms: int = 5000
    # Fill the exact cache from llm.results (a router replica group reads them once).
    cache_fill: bool = True
    # llm.results is off the request path (cache fill, coalesced followers, the latency watch): the broker
    # holds each fetch of it until this much time has passed (or a megabyte is ready), so one fetch
    # carries many results instead of one each. A coalesced follower is answered this much later at most.
    # 0: fetched as every other subscription is (each result as it comes).
    results_fetch_wait_ms: int = Field(default=100, ge=0, le=1000)
    # Redis for the limits and the cache; None: the bus's redis_url. The final markers (who
    # answers a request) are always in the bus's redis_url, shared with scheduler and workers. Logged in
    # to as the router's Redis user (LLMBUS_REDIS_USERNAME) where the URL names none.
    state_redis_url: str | None = None
