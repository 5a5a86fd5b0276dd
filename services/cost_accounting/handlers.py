"""Thin handlers: decode -> core (pricing, GPU ledger, budgets) -> store / publish.

Two stages, both exactly once in effect:
  llm.results -> CostRecord on llm.costs   (dedupe by request id in Redis, marker set after publish;
                                            self-hosted results are held durably until priced)
  llm.costs   -> aggregates + budgets       (dedupe by record id, atomic with the increments)
so a record published twice (crash between publish and marker) still counts once, and the
aggregates can be rebuilt by replaying llm.costs from the start into an empty namespace.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from aiokafka.structs import ConsumerRecord

from llmbus import topics as t
from llmbus.bus.codec import BadMessage, decode
from llmbus.messages import (
    BookedTo,
    BudgetStatus,
    CostRecord,
    InferenceResult,
    Message,
    PriceBookUpdate,
    ScaleDecision,
    WorkerStatus,
)
from services.cost_accounting import metrics
from services.cost_accounting.core import budgets as b
from services.cost_accounting.core.aggregates import agg_key, scaling_increments
from services.cost_accounting.core.costing import ServedRequest, price_result
from services.cost_accounting.core.gpu_ledger import GpuLedger
from services.cost_accounting.core.money import usd
from services.cost_accounting.core.prices import PriceBook
from services.cost_accounting.store import CostStore

log = logging.getLogger(__name__)

DeadLetter = Callable[[ConsumerRecord, Exception], Awaitable[None]]


class CostHandlers:
    def __init__(
        self,
        book: PriceBook,
        ledger: GpuLedger,
        budgets: b.BudgetPolicy,
        store: CostStore,
        topics: t.Topics,
        publish_all: Callable[[str, Sequence[tuple[Message, str | None]]], Awaitable[None]],
        dead_letter: DeadLetter,
        batch_full_records: int = 500,
        settle_s: float = 2.0,
    ) -> None:
        self.book = book
        self.ledger = ledger
        self.budgets = budgets
        self.store = store
        self.topics = topics
        self.publish_all = publish_all
        self.dead_letter = dead_letter
        # (tenant, period) whose state this process has published: the first cost of a period
        # announces the state (OK after a new month began), later ones only new thresholds.
        self._announced: set[tuple[str, str]] = set()
        self._late_reported = 0
        # Catching up on a backlog (full batches of llm.results): the workers' heartbeats are ahead
        # of the results still to read, so closing intervals now would make those results late.
        # Intervals close only once no full batch came for `settle_s` (and `settle_s` after start).
        self.batch_full_records = batch_full_records
        self.settle_s = settle_s
        self._busy_until_s = time.monotonic() + settle_s

    async def restore(self) -> None:
        """After the heartbeat table is read: held self-hosted results and ledger cursors back in."""
        held, cursors = await self.store.load_held()
        for worker_id, cursor in cursors.items():
            self.ledger.restore(worker_id, cursor)
        for result in held:
            priced = price_result(result, self.book)
            if isinstance(priced, ServedRequest):
                self.ledger.add(priced)
        log.info("restored %d held results, %d worker cursors", len(held), len(cursors))

    def on_worker(self, status: WorkerStatus) -> None:
        self.ledger.observe(status)

    async def on_scaling(self, decision: ScaleDecision) -> None:
        """Scale-ups and -downs per pool, once per decision (pool + decision time), beside its cold starts."""
        if increments := scaling_increments(decision, self.topics.prefix):
            await self.store.apply_once(f"scale:{decision.pool}:{decision.decided_at_ms}", increments)

    def on_pricebook(self, update: PriceBookUpdate) -> None:
        """A runtime price book: validated like the file (raises ValidationError), then used from now on."""
        book = PriceBook.model_validate(update.book)
        self.book = book
        self.ledger.book = book  # running workers keep the rate they started with
        log.info(
            "price book updated by %r (%d hosted models, %d pools)",
            update.updated_by,
            len(book.hosted),
            len(book.pools),
        )

    async def on_results(self, raw: Sequence[ConsumerRecord]) -> None:
        if len(raw) >= self.batch_full_records:
            self._busy_until_s = time.monotonic() + self.settle_s
        results: list[InferenceResult] = []
        for record in raw:
            try:
                results.append(decode(record, InferenceResult))
            except BadMessage as exc:
                await self.dead_letter(record, exc)
        seen = await self.store.seen([r.request_id for r in results])
        costed: list[CostRecord] = []
        served: list[ServedRequest] = []
        fresh: set[str] = set()
        for result, was_seen in zip(results, seen, strict=True):
            if was_seen or result.request_id in fresh:
                metrics.RESULTS.labels("duplicate").inc()
                continue
            fresh.add(result.request_id)
            priced = price_result(result, self.book)
            if isinstance(priced, ServedRequest):
                served.append(priced)
                metrics.RESULTS.labels("held").inc()
            else:
                costed.append(priced)
                metrics.RESULTS.labels(priced.kind.value).inc()
        # Held durably (and marked seen) before the ledger takes them: a crash loses nothing.
        await self.store.hold([s.result for s in served])
        late = [record for s in served for record in self.ledger.add(s)]
        await self._publish_costs(costed + late)
        await self.store.mark_seen([r.request_id for r in costed])
        if late:
            await self.store.release(late, {})

    async def tick(self, now_ms: int, expiry_ms: int) -> int:
        """Close the ledger's final intervals; publish what they priced. Returns records published."""
        if time.monotonic() < self._busy_until_s:
            return 0
        records = self.ledger.close(now_ms, expiry_ms)
        if records:
            await self._publish_costs(records)
            lives = [*self.ledger.retired, *self.ledger.workers.values()]
            await self.store.release(records, {life.worker_id: life.cursor() for life in lives})
        metrics.LATE_RESULTS.inc(self.ledger.late_results - self._late_reported)
        self._late_reported = self.ledger.late_results
        return len(records)

    async def _publish_costs(self, records: list[CostRecord]) -> None:
        if records:
            await self.publish_all(self.topics.name(t.COSTS), [(r, r.tenant) for r in records])

    async def on_costs(self, raw: Sequence[ConsumerRecord]) -> None:
        records: list[CostRecord] = []
        for record in raw:
            try:
                records.append(decode(record, CostRecord))
            except BadMessage as exc:
                await self.dead_letter(record, exc)
        applied = await self.store.apply(records)
        tenants: dict[str, int] = {}
        for record, new in zip(records, applied, strict=True):
            if not new:
                continue
            who = record.tenant if record.booked_to == BookedTo.TENANT else f"_{record.booked_to.value}"
            metrics.COST_USD.labels(who, record.model, record.kind.value).inc(usd(record.cost_micro_usd))
            metrics.TOKENS.labels(who, record.model, "prompt").inc(record.prompt_tokens)
            metrics.TOKENS.labels(who, record.model, "completion").inc(record.completion_tokens)
            if record.saving_micro_usd:
                metrics.SAVING_USD.labels(who, record.model).inc(usd(record.saving_micro_usd))
            if record.booked_to == BookedTo.TENANT and record.tenant in self.budgets.tenants:
                tenants[record.tenant] = max(tenants.get(record.tenant, 0), record.booked_at_ms)
        await self._check_budgets(tenants)

    async def _check_budgets(self, latest_ms_by_tenant: dict[str, int]) -> None:
        if not latest_ms_by_tenant:
            return
        pairs = []
        for tenant, at_ms in latest_ms_by_tenant.items():
            budget = self.budgets.tenants[tenant]
            pairs.append((agg_key(self.topics.prefix, budget.period.value, at_ms, "tenant"), tenant))
        spent = await self.store.tenant_spent(pairs)
        statuses: list[tuple[Message, str | None]] = []
        for (tenant, at_ms), spent_micro in zip(latest_ms_by_tenant.items(), spent, strict=True):
            budget = self.budgets.tenants[tenant]
            period = b.period_key(budget.period, at_ms)
            threshold = b.crossed(self.budgets, spent_micro, budget.limit_usd)
            announce = (tenant, period) not in self._announced
            if threshold is not None and await self.store.first_alert(tenant, period, threshold):
                announce = True
                metrics.BUDGET_ALERTS.labels(str(threshold)).inc()
            if announce:
                self._announced.add((tenant, period))
                statuses.append(
                    (
                        BudgetStatus(
                            tenant=tenant,
                            period=budget.period.value,
                            period_key=period,
                            spent_usd=usd(spent_micro),
                            limit_usd=float(budget.limit_usd),
                            state=b.state_of(threshold),
                            threshold_perc=threshold,
                        ),
                        tenant,
                    )
                )
        if statuses:
            await self.publish_all(self.topics.name(t.BUDGETS), statuses)
