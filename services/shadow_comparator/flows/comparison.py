"""The comparison flow: decoded message → Comparator; a record it cannot take → BadMessage (the runtime's DLQ).

Results and costs come decoded (llmbus.bus.service decodes them and dead-letters what does not
decode). Experiments, models and feedback take the raw record: tombstones on the compacted
llm.experiments and llm.models forget a record, and a feedback's tenant is its topic's.
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
    ModelSpec,
)
from llmbus.domain.lifecycle import next_version
from llmbus.domain.registry import RegistryError
from llmbus.security import tenancy
from llmbus.state.experiment_versions import ExperimentVersions
from llmbus_services.shadow_comparator.core.comparator import Comparator

log = logging.getLogger(__name__)


class ComparatorHandlers:
    def __init__(
        self, comparator: Comparator, publisher: Publisher, topics: t.Topics, versions: ExperimentVersions
    ) -> None:
        self.comparator = comparator
        self.publisher = publisher
        self.topics = topics
        self.versions = versions  # compare-and-set of experiment records (llmbus.state.experiment_versions)

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

    async def on_model(self, record: ConsumerRecord) -> None:
        key = record.key.decode() if record.key else None
        if key is None:
            return
        if record.value is None:
            self.comparator.models.pop(key, None)
        else:
            self.comparator.models[key] = decode(record, ModelSpec)

    async def publish_decision(self, decision: ExperimentDecision, experiment: Experiment | None) -> Experiment | None:
        """The decision first (the evidence is on the log before the traffic moves), then a release's
        registry records (its version's new state; on promotion the serving record), then the new split;
        returns the experiment in force now (None: unchanged).

        The new split is the change of the version decided on: it is written (compare-and-set) only if
        no other change came after that version, e.g. an operator's stop the decision loop has not read
        yet. Then neither the decision nor the split goes out, and the version that won is returned
        (published again, with its registry records, when it is newer than what this comparator read:
        its writer may have died before publishing it)."""
        if experiment is None:
            await self.publisher.publish(self.topics.name(t.DECISIONS), decision, key=decision.experiment_id)
            return None
        written, current = await self.versions.compare_and_set(experiment.version, next_version(experiment, experiment))
        if not written:
            log.warning(
                "%s on %s not applied: decided on version %d, another change came first (%s)",
                decision.decision,
                decision.experiment_id,
                experiment.version,
                f"version {current.version}, {current.state.value}" if current is not None else "none",
            )
            if current is not None and current.version > experiment.version:
                await self._publish_experiment(current, current.note)
            return current
        updated = next_version(experiment, experiment)
        await self.publisher.publish(self.topics.name(t.DECISIONS), decision, key=decision.experiment_id)
        await self._publish_experiment(updated, "; ".join(decision.reasons))
        return updated

    async def _publish_experiment(self, experiment: Experiment, reason: str) -> None:
        """A release's registry records for the experiment's step (none once they show it), then the experiment."""
        try:
            records = self.comparator.registry_steps(experiment, reason[:2000])
        except RegistryError:  # the split still moves: the users must not wait for the registry's record
            log.exception("%s: the registry does not follow this step", experiment.experiment_id)
            records = []
        for spec in records:
            await self.publisher.publish(self.topics.name(t.MODELS), spec, key=spec.key)
            self.comparator.models[spec.key] = spec  # the next step must not follow from the old record
        await self.publisher.publish(self.topics.name(t.EXPERIMENTS), experiment, key=experiment.experiment_id)
