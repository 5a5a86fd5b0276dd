"""Thin handlers: decoded message → Comparator; a record it cannot take → BadMessage (the runtime's DLQ).

Results and costs come decoded (llmbus.bus.service decodes them and dead-letters what does not
decode). Experiments and feedback take the raw record: tombstones on the compacted
llm.experiments forget an experiment, and a feedback's tenant is its topic's.
"""

from __future__ import annotations

import logging

from aiokafka.structs import ConsumerRecord

from llmbus.bus import BadMessage, Publisher, decode
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    CostRecord,
    ErrorCode,
    Experiment,
    ExperimentDecision,
    Feedback,
    InferenceResult,
)
from llmbus.security import tenancy
from llmbus_services.shadow_comparator.core.comparator import Comparator

log = logging.getLogger(__name__)


class ComparatorHandlers:
    def __init__(self, comparator: Comparator, publisher: Publisher, topics: t.Topics) -> None:
        self.comparator = comparator
        self.publisher = publisher
        self.topics = topics

    async def on_result(self, result: InferenceResult) -> None:
        await self.comparator.on_result(result)

    async def on_cost(self, cost: CostRecord) -> None:
        await self.comparator.on_cost(cost)

    async def on_feedback(self, record: ConsumerRecord) -> None:
        """The feedback's tenant is its topic's (`llm.feedback.<tenant>`); a body claiming another is
        dead-lettered. On the shared `llm.feedback` (dev mode; the gateway's alone when auth is on) the body says."""
        feedback = decode(record, Feedback)
        try:
            source = tenancy.feedback_source_of(record.topic.removeprefix(self.topics.prefix))
            tenant = tenancy.check_tenant(source, feedback.tenant, what="feedback")
        except tenancy.Refused as refused:
            await self.comparator.on_feedback_refused(refused.reason)
            raise BadMessage(ErrorCode.FORBIDDEN, refused.reason, feedback.request_id) from None
        await self.comparator.on_feedback(feedback.model_copy(update={"tenant": tenant}))

    async def on_experiment(self, record: ConsumerRecord) -> None:
        if record.value is None:
            self.comparator.experiments.apply(None, record.key.decode() if record.key else None)
        else:
            self.comparator.experiments.apply(decode(record, Experiment))

    async def publish_decision(self, decision: ExperimentDecision, experiment: Experiment | None) -> None:
        """The decision first (the evidence is on the log before the traffic moves), then the new split."""
        await self.publisher.publish(self.topics.name(t.DECISIONS), decision, key=decision.experiment_id)
        if experiment is not None:
            await self.publisher.publish(self.topics.name(t.EXPERIMENTS), experiment, key=experiment.experiment_id)
