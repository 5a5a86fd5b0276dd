"""Final answers to a client: the last chunk on its reply topic and the one InferenceResult.

Every service that ends a request (router on rejection or cache hit, scheduler on
timeout or exhausted attempts, worker on completion) ends it through here, so a client
never waits forever and analytics see exactly one result per request id.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from prometheus_client import Counter

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

log = logging.getLogger(__name__)
REPLY_FAILURES = Counter(
    "llmbus_reply_chunk_failures_total", "Final chunks that could not be written to a reply topic (the result was)"
)
# How long a final answer is retried (a broker restart included) before its publisher gives up.
# Its request's final marker is taken: giving up early could only mean no answer at all.
RESULT_RETRY_S = 300.0


async def publish_result(
    publisher: Publisher,
    topics: t.Topics,
    result: InferenceResult,
    reply_topic: str | None,
    last_seq: int = -1,
    content_chunks: Sequence[TokenChunk] = (),
    retry_for_s: float = RESULT_RETRY_S,
) -> None:
    """Publish the result, then `content_chunks` and the final chunk (seq after theirs) on the reply topic.

    The result goes first and alone decides success: it is the record every reader relies on,
    and once it is out the request is answered (its final marker is taken). Each record is
    retried for `retry_for_s` (a broker restart is ridden out): a late ack is waited for, a
    failed send is sent again unchanged, so the answer is never replaced by another one. A
    PublishTimeout after that means the result may or may not be out: the caller must not
    answer the request differently. A reply topic that refuses the chunks (gone, full, too
    slow) is logged, never raised: raising would send the request round again and give it a
    second result.
    """
    await publisher.publish(topics.name(t.RESULTS), result, key=result.request_id, retry_for_s=retry_for_s)
    if not reply_topic:
        return
    seq = content_chunks[-1].seq if content_chunks else last_seq
    final = TokenChunk(
        request_id=result.request_id,
        tenant=result.tenant,
        seq=seq + 1,
        final=True,
        finish_reason=result.finish_reason,
        usage=result.usage,
        error=result.error,
        model=result.model,
        shadow=result.shadow,
        attempt=result.attempt,
    )
    try:
        for chunk in [*content_chunks, final]:
            await publisher.publish(
                reply_topic,
                chunk,
                key=result.request_id,
                request_id=result.request_id,
                tenant=result.tenant,
                retry_for_s=retry_for_s,
            )
    except Exception:
        REPLY_FAILURES.inc()
        log.warning(
            "result of %s is out; its final chunk could not go to %s", result.request_id, reply_topic, exc_info=True
        )


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
