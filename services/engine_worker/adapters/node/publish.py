"""This node's hardware profile: its node agent's from llm.nodes, else the worker's own probe, published.

A node agent (services/node_agent) profiles the node for every worker on it; a worker reads that profile
(compacted llm.nodes, key: node id) at start and at each re-profile. Where no agent speaks for the node, or
its last profile is older than `agent_max_age_s` (the agent is down), the worker probes NVML (or the CPU)
itself and publishes what it found, as before there were agents.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from llmbus.bus import Bus
from llmbus.contract import topics as t
from llmbus.contract.messages import NodeProfile, now_ms
from llmbus.node.probe import profile_node

log = logging.getLogger(__name__)
ReadNodes = Callable[[], Awaitable[dict[str, NodeProfile]]]  # llm.nodes as a table (ServiceRuntime.read_table)


async def profile_and_publish(bus: Bus, node_id: str) -> NodeProfile:
    # NVML calls block; keep them off the event loop.
    profile = await asyncio.to_thread(profile_node, node_id)
    await bus.publisher.publish(bus.topics.name(t.NODES), profile, key=profile.node_id)
    return profile


class NodeProfiles:
    """The profile of the worker's node, the node agent's first."""

    def __init__(self, bus: Bus, read_nodes: ReadNodes, node_id: str, agent_max_age_s: float) -> None:
        self.bus, self.read_nodes, self.node_id = bus, read_nodes, node_id
        self.agent_max_age_ms = agent_max_age_s * 1000
        self.from_agent: bool | None = None  # None until the first refresh

    async def refresh(self) -> NodeProfile:
        agent = await self._agents()
        if agent is not None:
            self._say(True)
            return agent
        self._say(False)
        return await profile_and_publish(self.bus, self.node_id)

    async def _agents(self) -> NodeProfile | None:
        try:
            table = await self.read_nodes()
        except Exception:  # the probe below answers; the next refresh asks again
            log.warning("could not read llm.nodes for the node agent's profile", exc_info=True)
            return None
        profile = table.get(self.node_id)
        fresh = profile is not None and now_ms() - profile.profiled_at_ms <= self.agent_max_age_ms
        return profile if profile is not None and profile.source == "agent" and fresh else None

    def _say(self, from_agent: bool) -> None:
        if from_agent != self.from_agent:
            how = "its node agent's profile" if from_agent else "its own probe (no node agent speaks for it)"
            log.info("node %s: the worker uses %s", self.node_id, how)
        self.from_agent = from_agent
