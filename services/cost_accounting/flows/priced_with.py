"""What bills are priced with: the workers' lives (heartbeats, for the GPU ledger), the price book at
run time, and scale events per pool (counted once per decision, beside their cold starts)."""

from __future__ import annotations

import logging

from llmbus.contract.messages import (
    PriceBookUpdate,
    ScaleDecision,
    WorkerStatus,
)
from llmbus_services.cost_accounting.adapters import metrics
from llmbus_services.cost_accounting.core.aggregates import scaling_increments
from llmbus_services.cost_accounting.core.prices import PriceBook
from llmbus_services.cost_accounting.flows.billing import BillingFlow

log = logging.getLogger(__name__)


class PricedWithFlow(BillingFlow):
    def on_worker(self, status: WorkerStatus) -> None:
        self.ledger.observe(status)
        metrics.MODEL_LABELS.learn(status.models)

    async def on_scaling(self, decision: ScaleDecision) -> None:
        """Scale-ups and -downs per pool, once per decision (pool + decision time), beside its cold starts."""
        if increments := scaling_increments(decision, self.topics.prefix):
            await self.store.apply_once(f"scale:{decision.pool}:{decision.decided_at_ms}", increments)

    def on_pricebook(self, update: PriceBookUpdate) -> None:
        """A runtime price book: validated like the file (raises ValidationError), then used from now on."""
        book = PriceBook.model_validate(update.book)
        self.book = book
        self.ledger.book = book  # running workers keep the rate they started with
        metrics.learn_price_book(book)
        log.info(
            "price book updated by %r (%d hosted models, %d pools)",
            update.updated_by,
            len(book.hosted),
            len(book.pools),
        )
