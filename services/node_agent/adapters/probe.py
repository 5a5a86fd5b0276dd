"""Profile the node through NVML (llmbus.node.probe) in a thread: NVML calls block."""

from __future__ import annotations

import asyncio
from types import ModuleType

from llmbus.contract.messages import NodeProfile
from llmbus.node.probe import profile_node


async def probe(node_id: str, nvml: ModuleType | None = None) -> NodeProfile:
    """The node's profile; `nvml`: an NVML binding already initialised (None: pynvml, or the CPU profile)."""
    return await asyncio.to_thread(profile_node, node_id, nvml)
