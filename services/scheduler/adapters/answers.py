"""What the bus says of a request's answer before the scheduler places it again or ends it: a lapsed claim's
result on llm.results (llmbus.state.fencing), the legs of the answer so far on its reply topic
(llmbus.bus.read_back)."""

from __future__ import annotations

from llmbus.bus import Bus
from llmbus.bus.read_back import read_back
from llmbus.bus.replies import reply_topic_of, result_out_since
from llmbus.contract.messages import RoutedRequest
from llmbus.contract.request_key import RequestKey
from llmbus.state.fencing import RequestFence

# The answer so far is read back from this much before the request's receipt (then a minute, if its start is
# not there: a clock further off).
READ_MARGIN_MS = 5_000


async def lapsed_result_marked(bus: Bus, fence: RequestFence, key: RequestKey) -> bool:
    """An attempt claimed the result and its lease lapsed before it marked it done: True if its result is on
    llm.results (marked done now). Raises when llm.results could not be read to its end."""
    if (since_ms := await fence.lapsed_claim_ms(key)) is None:
        return False
    attempt = await result_out_since(bus.settings, bus.topics, key, since_ms, service=bus.service)
    if attempt is None:
        return False
    await fence.final_published(key, attempt)
    return True


async def answer_legs(bus: Bus, routed: RoutedRequest, before_attempt: int) -> set[int]:
    """The attempts before `before_attempt` whose text the answer so far is made of, as its client was sent it:
    none when no text was streamed, or when the next attempt would start it again (it cannot be continued).
    Raises when the reply topic could not be read to its end."""
    reply_topic = reply_topic_of(bus.topics, routed.request.reply_topic)
    found = await read_back(
        bus.settings, reply_topic, routed, before_attempt, READ_MARGIN_MS, bus.settings.admin_timeout_s
    )
    so_far = found.so_far
    if so_far is None or so_far.problem is not None:
        return set()
    return {segment.attempt for segment in so_far.segments}
