"""Router settings (env prefix LLMBUS_ROUTER_)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class RouterSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_ROUTER_", extra="ignore")

    default_model: str = "sim-llama-8b"
    max_in_flight: int = 512
    allowed_reply_topic_prefix: str = "llm."  # reply topics must live in the llm.* namespace
