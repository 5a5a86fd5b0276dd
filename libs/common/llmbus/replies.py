"""Final answers to a client: the last chunk on its reply topic and the one InferenceResult.

Every service that ends a request (router on rejection or cache hit, scheduler on
timeout or exhausted attempts, worker on completion) ends it through here, so a client
never waits forever and analytics see exactly one result per request id.
"""

from __future__ import annotations

import asyncio

from llmbus import topics as t
from llmbus.bus.producer import Publisher
from llmbus.messages import (
    DEFAULT_REPLY_TOPIC,
    ErrorInfo,
    FinishReason,
    InferenceResult,
    ResultStatus,
    TokenChunk,
)


async def publish_result(
    publisher: Publisher, topics: t.Topics, result: InferenceResult, reply_topic: str | None, last_seq: int = -1
) -> None:
    """Publish the final chunk (seq after `last_seq`) and the result, keyed by request id; returns
    when both are acknowledged. They go out together (one produce round trip, not two): they are
    on different topics, so no reader could see an order between them anyway."""
    result_topic = topics.name(t.RESULTS)
    if reply_topic:
        final = TokenChunk(
            request_id=result.request_id,
            tenant=result.tenant,
            seq=last_seq + 1,
            final=True,
            finish_reason=result.finish_reason,
            usage=result.usage,
            error=result.error,
            model=result.model,
            shadow=result.shadow,
            attempt=result.attempt,
        )
        await asyncio.gather(
            publisher.publish(reply_topic, final, key=result.request_id),
            publisher.publish(result_topic, result, key=result.request_id),
        )
        return
    await publisher.publish(result_topic, result, key=result.request_id)


def reply_topic_of(topics: t.Topics, reply_topic: str | None) -> str:
    """Reply topics named in requests are relative to the namespace, like every other topic."""
    return topics.name(reply_topic or DEFAULT_REPLY_TOPIC)


async def publish_error(
    publisher: Publisher,
    topics: t.Topics,
    *,
    request_id: str,
    tenant: str,
    error: ErrorInfo,
    produced_by: str,
    reply_topic: str | None,
    **fields: object,
) -> InferenceResult:
    result = InferenceResult(
        request_id=request_id,
        tenant=tenant,
        status=ResultStatus.ERROR,
        error=error,
        finish_reason=FinishReason.ERROR,
        produced_by=produced_by,
        **fields,  # type: ignore[arg-type]
    )
    await publish_result(publisher, topics, result, reply_topic)
    return result
