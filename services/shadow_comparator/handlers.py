"""Thin FastStream handlers: raw record → decoded message → Comparator; bad records → llm.dlq.

Handlers take the raw record (not a pydantic-typed body) so a record that does not decode
goes to the DLQ with the project's reason codes instead of being redelivered forever, and
tombstones on the compacted llm.experiments topic can be told apart from messages.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TypeVar

from aiokafka.structs import ConsumerRecord
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage

from llmbus import tenancy
from llmbus import topics as t
from llmbus.bus import BadMessage, decode
from llmbus.bus import headers as hdr
from llmbus.bus.dlq import DEAD_LETTERS, dead_letter
from llmbus.messages import (
    CostRecord,
    ErrorCode,
    Experiment,
    ExperimentDecision,
    Feedback,
    InferenceResult,
    Message,
)
from services.shadow_comparator.comparator import Comparator

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)


class BrokerPublisher:
    """llmbus headers and a bounded wait for the broker's ack, over FastStream's producer."""

    def __init__(self, broker: KafkaBroker, service: str, send_timeout_s: float) -> None:
        self.broker = broker
        self.service = service
        self.send_timeout_s = send_timeout_s

    async def publish(self, topic: str, value: Message, *, key: str | None, request_id: str | None = None) -> None:
        headers = {k: v.decode() for k, v in hdr.outgoing(value, self.service, request_id=request_id)}
        await asyncio.wait_for(
            self.broker.publish(value.to_bytes(), topic, key=key.encode() if key else None, headers=headers),
            self.send_timeout_s,
        )


class ComparatorHandlers:
    def __init__(self, comparator: Comparator, publisher: BrokerPublisher, topics: t.Topics) -> None:
        self.comparator = comparator
        self.publisher = publisher
        self.topics = topics

    async def _decode(self, record: ConsumerRecord, model: type[M]) -> M | None:
        try:
            return decode(record, model)
        except BadMessage as bad:
            await self._dead_letter(record, bad.code, bad.reason, bad.request_id)
            return None

    async def _dead_letter(self, record: ConsumerRecord, code: str, reason: str, request_id: str | None) -> None:
        letter = dead_letter(record, code, reason, self.publisher.service, request_id)
        key = record.key.decode(errors="replace") if record.key is not None else None
        log.warning("dead letter from %s@%d: %s", record.topic, record.offset, reason)
        await self.publisher.publish(self.topics.name(t.DLQ), letter, key=key, request_id=request_id)
        DEAD_LETTERS.labels(self.publisher.service, code).inc()

    async def on_result(self, msg: KafkaMessage) -> None:
        if (result := await self._decode(msg.raw_message, InferenceResult)) is not None:
            await self.comparator.on_result(result)

    async def on_cost(self, msg: KafkaMessage) -> None:
        if (cost := await self._decode(msg.raw_message, CostRecord)) is not None:
            await self.comparator.on_cost(cost)

    async def on_feedback(self, msg: KafkaMessage) -> None:
        """The feedback's tenant is its topic's (`llm.feedback.<tenant>`); a body claiming another is
        dead-lettered. On the shared `llm.feedback` (dev mode; the gateway's alone when auth is on) the body says."""
        record: ConsumerRecord = msg.raw_message
        if (feedback := await self._decode(record, Feedback)) is None:
            return
        try:
            source = tenancy.feedback_source_of(record.topic.removeprefix(self.topics.prefix))
            tenant = tenancy.check_tenant(source, feedback.tenant, what="feedback")
        except tenancy.Refused as refused:
            await self._dead_letter(record, ErrorCode.FORBIDDEN, refused.reason, feedback.request_id)
            await self.comparator.on_feedback_refused(refused.reason)
            return
        await self.comparator.on_feedback(feedback.model_copy(update={"tenant": tenant}))

    async def on_experiment(self, msg: KafkaMessage) -> None:
        record: ConsumerRecord = msg.raw_message
        if record.value is None:
            self.comparator.experiments.apply(None, record.key.decode() if record.key else None)
        elif (experiment := await self._decode(record, Experiment)) is not None:
            self.comparator.experiments.apply(experiment)

    async def publish_decision(self, decision: ExperimentDecision, experiment: Experiment | None) -> None:
        """The decision first (the evidence is on the log before the traffic moves), then the new split."""
        await self.publisher.publish(self.topics.name(t.DECISIONS), decision, key=decision.experiment_id)
        if experiment is not None:
            await self.publisher.publish(self.topics.name(t.EXPERIMENTS), experiment, key=experiment.experiment_id)
