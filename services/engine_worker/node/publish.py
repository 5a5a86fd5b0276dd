"""Publishes this node's hardware profile to llm.nodes (compacted, key: node id)."""

from __future__ import annotations

import asyncio
import logging

from llmbus import topics as t
from llmbus.bus import Bus
from services.engine_worker.config import WorkerSettings

log = logging.getLogger(__name__)


async def publish_node_profile(bus: Bus, settings: WorkerSettings) -> None:
    try:
        from services.engine_worker.node.profile import profile_node
    except ImportError:  # profiler not installed in this build: the worker still serves
        log.warning("no node profiler available; llm.nodes not published")
        return
    # NVML calls block; keep them off the event loop.
    profile = await asyncio.to_thread(profile_node, settings.node_id)
    await bus.publisher.publish(bus.topics.name(t.NODES), profile, key=profile.node_id)
    log.info("node profile published: %s with %d GPU(s)", profile.kind, len(profile.gpus))
