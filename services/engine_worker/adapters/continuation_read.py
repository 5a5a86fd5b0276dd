"""The answer a client was sent before this attempt, read back from the request's reply topic
(llmbus.bus.read_back), timed."""

from __future__ import annotations

import time

from llmbus.bus import Bus
from llmbus.bus.read_back import ReadBack
from llmbus.bus.read_back import read_back as read_reply_topic
from llmbus.contract.messages import Dispatch
from llmbus_services.engine_worker.adapters import metrics

__all__ = ["ReadBack", "read_back"]


async def read_back(bus: Bus, reply_topic: str, dispatch: Dispatch, margin_ms: int, timeout_s: float) -> ReadBack:
    """What attempts before `dispatch`'s streamed of its answer. Raises when the reply topic cannot be
    read to its end in time (the caller restarts the answer rather than guess)."""
    started = time.monotonic()
    found = await read_reply_topic(bus.settings, reply_topic, dispatch.routed, dispatch.attempt, margin_ms, timeout_s)
    metrics.CONTINUATION_READ_SECONDS.observe(time.monotonic() - started)
    return found
