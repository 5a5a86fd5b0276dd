"""Autoscaler settings (env prefix LLMBUS_AUTOSCALER_)."""

from __future__ import annotations

from typing import Literal

from pydantic_settings import BaseSettings, SettingsConfigDict


class AutoscalerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_AUTOSCALER_", extra="ignore")

    pools: str = "default"  # services/autoscaler/policies/<name>.yaml, or a path to a YAML file
    actuator: Literal["local", "kubernetes", "none"] = "local"
    kubernetes_host: str | None = None  # None: in-cluster config, else ~/.kube/config
    worker_stale_s: float = 5.0  # a worker silent this long is not counted ready or warming
