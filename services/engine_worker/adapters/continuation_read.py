"""The answer a client was sent before this attempt, read back from the request's reply topic.

The chunks on the reply topic are what the client saw, so they are what the next leg continues from
(docs/delivery.md, "Continuation across legs"). One read of the request's partition, from the request's
receipt (the router's clock) less `margin_ms` to the end as of now; an answer whose first chunk is
not there (a clock further off than the margin) is read again from a minute earlier, the margin every
look-up by time allows (llmbus.bus.replies.CLOCK_SKEW_MS).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from llmbus.bus import Bus
from llmbus.bus.codec import BadMessage, decode
from llmbus.bus.replies import CLOCK_SKEW_MS
from llmbus.bus.tables import records_since
from llmbus.contract.chunks import SoFar, answer_so_far
from llmbus.contract.messages import Dispatch, TokenChunk
from llmbus_services.engine_worker.adapters import metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadBack:
    """The answer so far (None: nothing was streamed, or the stream has ended) and when each of its
    chunks was written, (attempt, seq) → record timestamp (ms)."""

    so_far: SoFar | None
    written_ms: dict[tuple[int, int], int] = field(default_factory=dict)


async def read_back(bus: Bus, reply_topic: str, dispatch: Dispatch, margin_ms: int, timeout_s: float) -> ReadBack:
    """What attempts before `dispatch`'s streamed of its answer. Raises when the reply topic cannot be
    read to its end in time (the caller restarts the answer rather than guess)."""
    started = time.monotonic()
    received_ms = dispatch.routed.received_at_ms
    found = await _read(bus, reply_topic, dispatch, received_ms - margin_ms, timeout_s)
    so_far = found.so_far
    if so_far is not None and so_far.problem is not None and margin_ms < CLOCK_SKEW_MS:
        found = await _read(bus, reply_topic, dispatch, received_ms - CLOCK_SKEW_MS, timeout_s)
    metrics.CONTINUATION_READ_SECONDS.observe(time.monotonic() - started)
    return found


async def _read(bus: Bus, reply_topic: str, dispatch: Dispatch, since_ms: int, timeout_s: float) -> ReadBack:
    request = dispatch.routed.request
    records = await records_since(bus.settings, reply_topic, since_ms, timeout_s, key=request.request_id)
    chunks: list[TokenChunk] = []
    written_ms: dict[tuple[int, int], int] = {}
    for record in records:
        try:
            chunk = decode(record, TokenChunk)
        except BadMessage:
            continue
        if chunk.request_id != request.request_id or chunk.tenant != request.tenant:
            continue  # another request on the partition, or another tenant's of the same id
        chunks.append(chunk)
        written_ms.setdefault((chunk.attempt, chunk.seq), record.timestamp)
    return ReadBack(answer_so_far(chunks, dispatch.attempt), written_ms)
