"""Scheduler settings (env prefix LLMBUS_SCHEDULER_)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class SchedulerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_SCHEDULER_", extra="ignore")

    max_in_flight: int = 10_000  # routed requests held (placed or waiting) at once
    max_attempts: int = 3
    heartbeat_stale_s: float = 5.0  # a worker silent this long is not placed on
    no_worker_timeout_s: float = 60.0  # a request waiting this long for any worker gets a final error
