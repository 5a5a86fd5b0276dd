"""Node agent settings (env prefix LLMBUS_NODE_AGENT_)."""

from __future__ import annotations

import socket

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class NodeAgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMBUS_NODE_AGENT_", extra="ignore")

    # The node it speaks for: the engine-workers of this node use the same id (LLMBUS_WORKER_NODE_ID). In k8s
    # the DaemonSet sets it from the pod's spec.nodeName.
    node_id: str = Field(default_factory=socket.gethostname)
    interval_s: float = Field(default=15.0, gt=0.0)  # how often the node is profiled and its profile published
    # ECC thresholds per GPU (counts since the driver loaded, NVML's volatile counters). Corrected (single-bit)
    # errors above this: the node is degraded, drained of high-priority work (memory going bad, still right).
    ecc_corrected_degraded_above: int = Field(default=100, ge=0)
    # Uncorrected (double-bit) errors above this: the node is unhealthy and gets no work (data may be wrong).
    ecc_uncorrected_unhealthy_above: int = Field(default=0, ge=0)
