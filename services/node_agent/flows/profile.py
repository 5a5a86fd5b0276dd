"""The node agent's flow (thin): probe the node → judge its health (core) → publish the profile on llm.nodes."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from llmbus.contract.messages import NodeHealth, NodeProfile
from llmbus_services.node_agent.core.health import EccThresholds, judge

log = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[NodeProfile]]
Publish = Callable[[NodeProfile], Awaitable[None]]


class NodeAgentHandlers:
    def __init__(self, probe: Probe, publish: Publish, thresholds: EccThresholds) -> None:
        self.probe = probe
        self.publish = publish
        self.thresholds = thresholds
        self.latest: NodeProfile | None = None  # what /metrics reads

    async def profile_once(self) -> NodeProfile:
        profile = await self.probe()
        profile.source = "agent"
        profile.health, profile.health_reason = judge(profile, self.thresholds)
        if self.latest is None or profile.health != self.latest.health:
            level = logging.INFO if profile.health == NodeHealth.OK else logging.WARNING
            log.log(level, "node %s: %s %s", profile.node_id, profile.health.value, profile.health_reason)
        await self.publish(profile)
        self.latest = profile
        return profile
