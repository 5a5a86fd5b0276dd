"""Final answers to a client: the last chunk on its reply topic and the one InferenceResult.

Every service that ends a request (router on rejection or cache hit, scheduler on
timeout or exhausted attempts, worker on completion) ends it through here, so a client
never waits forever and analytics see exactly one result per request id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from prometheus_client import Counter

from llmbus.bus.producer import Publisher, worth_resending
from llmbus.bus.tables import read_since
from llmbus.contract import topics as t
from llmbus.contract.contracts import BY_SERVICE
from llmbus.contract.messages import (
    DEFAULT_REPLY_TOPIC,
    ContinuedFrom,
    ErrorInfo,
    FinishReason,
    InferenceResult,
    ResultStatus,
    TokenChunk,
)
from llmbus.contract.request_key import RequestKey, request_id_of
from llmbus.settings import BusSettings

log = logging.getLogger(__name__)
REPLY_FAILURES = Counter(
    "llmbus_reply_chunk_failures_total", "Final chunks that could not be written to a reply topic (the result was)"
)
# How long a final answer is retried (a broker restart included) before its publisher gives up.
# Its request's final marker is taken: giving up early could only mean no answer at all.
RESULT_RETRY_S = 300.0
# Claim times come from the claimants' clocks: a result is looked for from a minute before one.
CLOCK_SKEW_MS = 60_000


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
    await _publish_reply_chunks(
        publisher, result, reply_topic, [*content_chunks, final_chunk(result, seq + 1)], retry_for_s
    )


async def publish_result_with_final(
    publisher: Publisher,
    topics: t.Topics,
    result: InferenceResult,
    reply_topic: str,
    last_seq: int,
    retry_for_s: float = RESULT_RETRY_S,
    continues: ContinuedFrom | None = None,
) -> None:
    """publish_result for a stream whose content chunks are all acknowledged: the final chunk goes out
    beside the result, in the same produce request, instead of one round trip after it.

    The final chunk is only enqueued (Publisher.send) just before the result, so the two reach the
    broker together; the result is then published and waited for exactly as publish_result does
    (it decides success; a PublishTimeout means it may or may not be out, and the caller answers
    nothing else). The reader may now see the final chunk a moment before the result is
    acknowledged: the same content and final chunk publish_result would show it one round trip
    later. Only a result refused for good differs (llm.results not writable, or a result over the
    record size limit, which the limits on max_tokens and the model length keep far away): the
    final chunk may have ended the reader's stream while the request is handed back. A final chunk not
    acknowledged (or not enqueued at all) is published again after the result, like
    publish_result's; a reply topic that refuses it is logged, never raised.
    """
    final = final_chunk(result, last_seq + 1, continues)
    sent: list[asyncio.Future[object]] = []
    try:
        # Its request id and tenant headers are the chunk's own.
        sent.append(await publisher.publish(reply_topic, final, key=result.request_id, wait=False))
    except Exception:
        log.warning("final chunk of %s not enqueued; it follows the result", result.request_id, exc_info=True)
    await publisher.publish(topics.name(t.RESULTS), result, key=result.request_id, retry_for_s=retry_for_s)
    if sent:
        try:
            await publisher.delivered(sent, retry_for_s=retry_for_s)
            return
        except Exception as exc:  # noqa: BLE001 - the result is out: raising would answer the request twice
            if not worth_resending(exc):
                _reply_failed(result, reply_topic)
                return
            log.warning("final chunk of %s not acknowledged (%r): sending it again", result.request_id, exc)
    # The content before it is acknowledged (the caller's rule), so the final alone keeps the order.
    await _publish_reply_chunks(publisher, result, reply_topic, [final], retry_for_s)


def final_chunk(result: InferenceResult, seq: int, continues: ContinuedFrom | None = None) -> TokenChunk:
    """The chunk that ends a reply stream: the result's finish reason, usage and error, at `seq`; `continues`:
    its attempt's marker, when it continues an earlier attempt's answer."""
    return TokenChunk(
        request_id=result.request_id,
        tenant=result.tenant,
        seq=seq,
        final=True,
        finish_reason=result.finish_reason,
        usage=result.usage,
        error=result.error,
        model=result.model,
        shadow=result.shadow,
        attempt=result.attempt,
        route_reason=result.route_reason,
        release=result.release,
        continues=continues,
    )


async def _publish_reply_chunks(
    publisher: Publisher, result: InferenceResult, reply_topic: str, chunks: Sequence[TokenChunk], retry_for_s: float
) -> None:
    """The chunks after a published result, in order, each retried; a refusing reply topic is logged."""
    try:
        for chunk in chunks:
            await publisher.publish(
                reply_topic,
                chunk,
                key=result.request_id,
                request_id=result.request_id,
                tenant=result.tenant,
                retry_for_s=retry_for_s,
            )
    except Exception:  # noqa: BLE001 - the result is out: raising would answer the request twice
        _reply_failed(result, reply_topic)


def _reply_failed(result: InferenceResult, reply_topic: str) -> None:
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


class UndeclaredRead(RuntimeError):
    """A service read a topic its contract does not declare (the ACLs generated from it would deny it)."""


async def result_out_since(
    settings: BusSettings, topics: t.Topics, key: RequestKey, since_ms: int, *, service: str
) -> int | None:
    """The attempt whose result for `key` is on llm.results since `since_ms` (less the clocks' skew),
    None if there is none. For a claimant that took over from one that never marked its result done
    (llmbus.state.fencing's `claimed`): that result may be out. Reads only the request's partition,
    to its end as of now; raises when it cannot (answering blind could be a second result).

    Only for a `service` whose contract declares the look-up (llmbus.contract.contracts.RESULT_LOOKUP):
    on a secured stack its ACLs, generated from the contracts, allow exactly the declared reads."""
    contract = BY_SERVICE.get(service)
    if contract is None or not contract.looks_up(t.RESULTS):
        raise UndeclaredRead(f"{service} does not declare looking up {t.RESULTS} (llmbus.contract.contracts)")
    results = await read_since(
        settings,
        topics.name(t.RESULTS),
        InferenceResult,
        since_ms - CLOCK_SKEW_MS,
        timeout_s=settings.admin_timeout_s,
        key=request_id_of(key),
    )
    return next((r.attempt for r in results if r.request_key == key), None)
