"""Dead letters: the raw record and the reason it could not be handled."""

from __future__ import annotations

import base64
import logging

from aiokafka.structs import ConsumerRecord
from prometheus_client import Counter

from llmbus import topics as t
from llmbus.bus.producer import Publisher
from llmbus.messages import DeadLetter

log = logging.getLogger(__name__)

DEAD_LETTERS = Counter("llmbus_dead_letters_total", "Records sent to the DLQ", ["service", "code"])


def dead_letter(record: ConsumerRecord, code: str, reason: str, service: str, request_id: str | None) -> DeadLetter:
    return DeadLetter(
        source_topic=record.topic,
        source_partition=record.partition,
        source_offset=record.offset,
        raw_key_b64=base64.b64encode(record.key).decode() if record.key is not None else None,
        raw_value_b64=base64.b64encode(record.value or b"").decode(),
        error_code=code,
        error=reason[:4000],
        service=service,
        request_id=request_id,
    )


async def send_to_dlq(
    publisher: Publisher,
    topics: t.Topics,
    record: ConsumerRecord,
    code: str,
    reason: str,
    service: str,
    request_id: str | None = None,
) -> None:
    letter = dead_letter(record, code, reason, service, request_id)
    key = record.key.decode(errors="replace") if record.key is not None else None
    log.warning("dead letter from %s[%d]@%d: %s: %s", record.topic, record.partition, record.offset, code, reason)
    await publisher.publish(topics.name(t.DLQ), letter, key=key, request_id=request_id)
    DEAD_LETTERS.labels(service, code).inc()
