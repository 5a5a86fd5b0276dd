"""An answer as its client was sent it, read back from the request's reply topic.

The chunks on the reply topic are what the client saw, so they are what the next leg of a cut answer
continues from (docs/delivery.md, "Continuation across legs"), and what tells the scheduler which
attempts' text the answer so far is made of (its legs, which max_attempts does not count). One read of
the request's partition, from the request's receipt (the router's clock) less `margin_ms` to the end as
of now; an answer whose first chunk is not there (a clock further off than the margin) is read again
from a minute earlier, the margin every look-up by time allows (llmbus.bus.replies.CLOCK_SKEW_MS).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmbus.bus.codec import BadMessage, decode
from llmbus.bus.replies import CLOCK_SKEW_MS
from llmbus.bus.tables import records_since
from llmbus.contract.chunks import SoFar, answer_so_far
from llmbus.contract.messages import RoutedRequest, TokenChunk
from llmbus.settings import BusSettings


@dataclass(frozen=True)
class ReadBack:
    """The answer so far (None: nothing was streamed, or the stream has ended) and when each of its
    chunks was written, (attempt, seq) → record timestamp (ms)."""

    so_far: SoFar | None
    written_ms: dict[tuple[int, int], int] = field(default_factory=dict)


async def read_back(
    settings: BusSettings,
    reply_topic: str,
    routed: RoutedRequest,
    before_attempt: int,
    margin_ms: int,
    timeout_s: float,
) -> ReadBack:
    """What the attempts before `before_attempt` streamed of `routed`'s answer. Raises when the reply topic
    cannot be read to its end in time (a guess could repeat or lose text)."""
    received_ms = routed.received_at_ms
    found = await _read(settings, reply_topic, routed, before_attempt, received_ms - margin_ms, timeout_s)
    so_far = found.so_far
    if so_far is not None and so_far.problem is not None and margin_ms < CLOCK_SKEW_MS:
        found = await _read(settings, reply_topic, routed, before_attempt, received_ms - CLOCK_SKEW_MS, timeout_s)
    return found


async def _read(
    settings: BusSettings, reply_topic: str, routed: RoutedRequest, before_attempt: int, since_ms: int, timeout_s: float
) -> ReadBack:
    request = routed.request
    chunks: list[TokenChunk] = []
    written_ms: dict[tuple[int, int], int] = {}
    for record in await records_since(settings, reply_topic, since_ms, timeout_s, key=request.request_id):
        try:
            chunk = decode(record, TokenChunk)
        except BadMessage:
            continue
        if chunk.request_id != request.request_id or chunk.tenant != request.tenant:
            continue  # another request on the partition, or another tenant's of the same id
        chunks.append(chunk)
        written_ms.setdefault((chunk.attempt, chunk.seq), record.timestamp)
    return ReadBack(answer_so_far(chunks, before_attempt), written_ms)
