"""This node's hardware profile on llm.nodes (compacted, key: node id), at start and periodically."""

from __future__ import annotations

import asyncio
import logging

from llmbus.bus import Bus
from llmbus.contract import topics as t
from llmbus.contract.messages import NodeProfile
from llmbus_services.engine_worker.adapters.node.profile import profile_node

log = logging.getLogger(__name__)


async def profile_and_publish(bus: Bus, node_id: str) -> NodeProfile:
    # NVML calls block; keep them off the event loop.
    profile = await asyncio.to_thread(profile_node, node_id)
    await bus.publisher.publish(bus.topics.name(t.NODES), profile, key=profile.node_id)
    return profile
