"""The state the router follows: models (their tokenizers loaded off the event loop), experiments and
budgets; a tombstone removes its key."""

from __future__ import annotations

import asyncio
import logging

from aiokafka.structs import ConsumerRecord

from llmbus.bus import decode
from llmbus.contract.messages import (
    BudgetStatus,
    Experiment,
    ModelSpec,
)
from llmbus.domain.registry import is_version_key
from llmbus.observability.metric_children import MODEL_LABELS
from llmbus.tokens import try_load
from llmbus_services.router.flows.requests import RequestFlow

log = logging.getLogger(__name__)


class StateFlow(RequestFlow):
    async def on_model(self, record: ConsumerRecord) -> None:
        if record.value is None:  # tombstone: the model is gone
            if record.key and not is_version_key(record.key.decode()):
                self.core.catalog.remove(record.key.decode())
            return
        spec = decode(record, ModelSpec)
        if spec.record != "serving":
            return  # a version's registry record: the router routes by the serving record
        # Load its tokenizer off the event loop (seconds for a large vocabulary); routing then finds it cached.
        await asyncio.to_thread(try_load, spec.tokenizer)
        self.core.catalog.apply_spec(spec)
        MODEL_LABELS.learn([spec.name])  # registered: its own metric series (unknown names count as `other`)

    async def on_experiment(self, record: ConsumerRecord) -> None:
        if record.value is None:
            self.core.experiments.apply(None, record.key.decode() if record.key else None)
            return
        self.core.experiments.apply(decode(record, Experiment))

    async def on_budget(self, record: ConsumerRecord) -> None:
        if record.value is None:
            self.budgets.apply(None, record.key.decode() if record.key else None)
            return
        self.budgets.apply(decode(record, BudgetStatus))
