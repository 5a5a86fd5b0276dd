"""Autoscaler settings (env prefix LLMBUS_AUTOSCALER_)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class AutoscalerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_AUTOSCALER_", extra="ignore")

    pools: str = "default"  # services/autoscaler/policies/<name>.yaml, or a path to a YAML file
    actuator: Literal["local", "kubernetes", "none"] = "local"
    kubernetes_host: str | None = None  # None: in-cluster config, else ~/.kube/config
    # Every Kubernetes API call gives up after these (then retried with backoff): a hung API server
    # never holds the evaluation lock, and so every pool's scaling, for longer than their sum.
    kubernetes_connect_timeout_s: float = Field(default=5.0, gt=0)
    kubernetes_read_timeout_s: float = Field(default=10.0, gt=0)
    # More environment for the workers the local actuator starts (JSON object): on a secured dev stack
    # `llmbus up` puts the worker principal's credentials here, so workers never connect as the autoscaler.
    worker_env: dict[str, str] = Field(default_factory=dict)
    # /metrics of the workers the local actuator starts: worker n of a pool on base + n (0: none). They
    # never inherit the autoscaler's own LLMBUS_METRICS_PORT (a second bind of it kills the worker).
    worker_metrics_port_base: int = Field(default=0, ge=0, le=65000)
    worker_stale_s: float = 5.0  # a worker silent this long is not counted ready or warming
    # Pool statistics of several scheduler instances (core/merge.py): a pool is evaluated once all
    # live instances have reported, or this long after its last evaluation; an instance silent for
    # stats_instance_stale_s is no longer waited for. Both a little above the scheduler's interval (5 s).
    stats_max_wait_s: float = 7.5
    stats_instance_stale_s: float = 15.0
    # Statistics older than this (by their sent_at_ms) are not acted on: a restarted autoscaler
    # resuming from its committed offsets would otherwise scale on a past hour's queues.
    stats_max_age_s: float = 30.0
    # At start, a pool's last decision on llm.scaling younger than this that the actuator does not show
    # is applied again (the autoscaler died between recording and applying it); older ones are history.
    resume_max_age_s: float = Field(default=600.0, ge=0)
