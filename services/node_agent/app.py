"""Node agent wiring (llmbus.contract.contracts.NODE_AGENT: it writes llm.nodes and reads nothing): its first
profile published at start, then one every interval; its gauges on this process's /metrics."""

from __future__ import annotations

import asyncio
import logging
from types import ModuleType

from prometheus_client import REGISTRY

from llmbus.bus.service import ServiceRuntime
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import NodeProfile
from llmbus.node.gauges import register_node_metrics
from llmbus.settings import BusSettings
from llmbus_services.node_agent.adapters.probe import probe
from llmbus_services.node_agent.config import NodeAgentSettings
from llmbus_services.node_agent.core.health import EccThresholds
from llmbus_services.node_agent.flows import NodeAgentHandlers

log = logging.getLogger(__name__)


def build_app(runtime: ServiceRuntime, cfg: NodeAgentSettings, nvml: ModuleType | None = None) -> NodeAgentHandlers:
    """The flow, its start-up job and its timer. `nvml`: an NVML binding to probe with (None: pynvml, or none)."""
    nodes_topic = runtime.topics.name(t.NODES)

    async def publish(profile: NodeProfile) -> None:
        await runtime.publisher.publish(nodes_topic, profile, key=profile.node_id)

    handlers = NodeAgentHandlers(
        lambda: probe(cfg.node_id, nvml),
        publish,
        EccThresholds(cfg.ecc_corrected_degraded_above, cfg.ecc_uncorrected_unhealthy_above),
    )

    async def first_profile() -> None:
        """Published before the first interval (workers starting now read it); a failure fails the start."""
        first = await handlers.profile_once()
        log.info(
            "node agent for %s (%s, %s): every %.0fs", first.node_id, first.kind, first.hardware_class, cfg.interval_s
        )

    runtime.on_start(first_profile)
    runtime.every(cfg.interval_s, "node profile", handlers.profile_once)
    register_node_metrics(REGISTRY, lambda: handlers.latest)  # DCGM-named gauges and the node's own
    return handlers


async def main(
    settings: BusSettings,
    stop: asyncio.Event,
    nvml: ModuleType | None = None,
    agent_settings: NodeAgentSettings | None = None,
) -> None:
    """Serve until `stop`. `nvml` and `agent_settings`: an embedding process's (a test's stand-in NVML)."""
    cfg = agent_settings or NodeAgentSettings()
    await ServiceRuntime.serve(settings, contracts.NODE_AGENT, lambda runtime: build_app(runtime, cfg, nvml), stop)
