"""Dead letters: a bounded copy of the raw record, where it came from, and why it failed.

A dead letter can always be written: the raw key and value are cut to a bound (the sizes
and the source topic/partition/offset find the whole record in its topic), so a record
near the size limit cannot make its own dead letter too large. A write that still fails
is retried with backoff for `dlq_retry_s`, then logged, counted and skipped: a failing DLQ
never stops a service (a restart would only meet the same record again).
"""

from __future__ import annotations

import base64
import logging

from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord
from prometheus_client import Counter
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from llmbus.bus.codec import MAX_ID_CHARS
from llmbus.bus.failures import transient
from llmbus.bus.producer import Publisher
from llmbus.contract import topics as t
from llmbus.contract.messages import DeadLetter

log = logging.getLogger(__name__)

DEAD_LETTERS = Counter("llmbus_dead_letters_total", "Records sent to the DLQ", ["service", "code"])
DEAD_LETTER_FAILURES = Counter(
    "llmbus_dead_letter_failures_total", "Failing records that could not be dead-lettered (skipped)", ["service"]
)

MAX_KEY_BYTES = 1024
MAX_REASON_CHARS = 4000
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
DEFAULT_RETRY_S = 120.0


def dead_letter(
    record: ConsumerRecord,
    code: str,
    reason: str,
    service: str,
    request_id: str | None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> DeadLetter:
    value = record.value or b""
    key = record.key
    return DeadLetter(
        source_topic=record.topic,
        source_partition=record.partition,
        source_offset=record.offset,
        raw_key_b64=base64.b64encode(key[:MAX_KEY_BYTES]).decode() if key is not None else None,
        raw_value_b64=base64.b64encode(value[:max_payload_bytes]).decode(),
        raw_key_size_bytes=len(key) if key is not None else None,
        raw_value_size_bytes=len(value),
        raw_truncated=len(value) > max_payload_bytes or (key is not None and len(key) > MAX_KEY_BYTES),
        error_code=code,
        error=reason[:MAX_REASON_CHARS],
        service=service,
        request_id=request_id if request_id and len(request_id) <= MAX_ID_CHARS else None,
    )


async def send_to_dlq(
    publisher: Publisher,
    topics: t.Topics,
    record: ConsumerRecord,
    code: str,
    reason: str,
    service: str,
    request_id: str | None = None,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    retry_s: float = DEFAULT_RETRY_S,
) -> bool:
    """Write the dead letter; True once written, False if it was skipped (logged and counted). Never raises."""
    letter = dead_letter(record, code, reason, service, request_id, max_payload_bytes)
    key = record.key[:MAX_KEY_BYTES].decode(errors="replace") if record.key is not None else None
    where = f"{record.topic}[{record.partition}]@{record.offset}"
    log.warning("dead letter from %s: %s: %s", where, code, letter.error[:500])
    try:
        try:
            await _publish_with_retry(publisher, topics, letter, key, retry_s)
        except KafkaError as exc:
            if transient(exc):
                raise
            # The letter itself was refused (size, authorisation): the payload-free one says where to look.
            log.warning("dead letter from %s refused (%r); writing it without the payload", where, exc)
            bare = letter.model_copy(update={"raw_key_b64": None, "raw_value_b64": "", "raw_truncated": True})
            await _publish_with_retry(publisher, topics, bare, key, retry_s)
    except Exception:
        log.exception(
            "could not dead-letter %s (%s: %s): skipped; the record stays in %s until its retention",
            where,
            code,
            letter.error[:200],
            record.topic,
        )
        DEAD_LETTER_FAILURES.labels(service).inc()
        return False
    DEAD_LETTERS.labels(service, code).inc()
    return True


async def _publish_with_retry(
    publisher: Publisher, topics: t.Topics, letter: DeadLetter, key: str | None, retry_s: float
) -> None:
    async for attempt in AsyncRetrying(
        stop=stop_after_delay(retry_s),
        wait=wait_exponential(multiplier=0.2, max=10),
        retry=retry_if_exception(transient),
        reraise=True,
    ):
        with attempt:
            await publisher.publish(topics.name(t.DLQ), letter, key=key, request_id=letter.request_id)
