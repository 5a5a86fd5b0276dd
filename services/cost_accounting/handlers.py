"""Thin handlers: decode -> core (pricing, GPU ledger, budgets) -> store / publish.

One stage, llm.results -> CostRecords, billed in three steps per batch (`_bill`):
  1. stage   the encoded records in a Redis hash (the outbox), keyed by record id;
  2. publish exactly those bytes to llm.costs and wait for every ack;
  3. apply   them to the aggregates in one script, atomically with their markers (record id), the
             seen markers of the results they price, and their removal from the outbox.
The batch's offsets are committed after that. Why a crash anywhere bills once, and llm.costs stays
a faithful record stream (every applied record is on it, every copy of a record id is the same):
  - before 1 finishes: nothing is staged or published; the batch comes again and is priced again.
  - between 1 and 3: the staged bytes are the record. Before anything else after a restart (or an
    in-process failure), `recover` publishes the outbox again and applies it; the results are then
    seen, so the batch that comes again is skipped. A copy published twice is byte for byte the
    same (never re-priced: a price book changed in between cannot make two versions).
  - after 3, before the commit: the results are seen (atomically with the increments); skipped.
Self-hosted results are held durably (and marked seen) before the ledger takes them; the ledger's
records go through the same three steps, except that a record already applied (a restart closing
an interval again from an older cursor) is neither published nor applied again.
Replaying llm.results from the start into an empty namespace gives the same totals.

Replicas: each worker's GPU time is priced by exactly one replica, the holder of the worker's lease
in Redis (renewed every tick, `lease_s`). A worker's results are keyed by request id, so they land
on every replica's partitions; each replica holds what it reads in the worker's Redis hash, and the
owner prices all of them from there (the rest are never in another replica's intervals: two replicas
pricing a whole interval each over their own share of requests billed 1.97x). Why a lease and not
the partition of the worker's key: no partition of llm.results carries all of a worker's requests,
and a rebalance of llm.results moves none of this state -- the owner's inputs (the held results,
the cursor saved after each release) are in Redis, so a new owner (a lease that expired: its replica
died or stalled) takes over from the cursor exactly as a restart does, and if two replicas ever
close the same interval (an owner stalled past its lease), each record id is applied once.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence

from aiokafka.structs import ConsumerRecord

from llmbus.bus.codec import BadMessage, decode
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    BookedTo,
    BudgetStatus,
    CostKind,
    CostRecord,
    InferenceResult,
    Message,
    PriceBookUpdate,
    ScaleDecision,
    WorkerStatus,
)
from llmbus.contract.request_key import RequestKey
from services.cost_accounting.adapters import metrics
from services.cost_accounting.adapters.publishing import Items
from services.cost_accounting.adapters.store import CostStore
from services.cost_accounting.core import budgets as b
from services.cost_accounting.core.aggregates import agg_key, scaling_increments
from services.cost_accounting.core.costing import ServedRequest, price_result
from services.cost_accounting.core.gpu_ledger import GpuLedger
from services.cost_accounting.core.money import usd
from services.cost_accounting.core.prices import PriceBook

log = logging.getLogger(__name__)

DeadLetter = Callable[[ConsumerRecord, Exception], Awaitable[None]]
PublishRecords = Callable[[Items], Awaitable[None]]


class CostHandlers:
    def __init__(
        self,
        book: PriceBook,
        ledger: GpuLedger,
        budgets: b.BudgetPolicy,
        store: CostStore,
        topics: t.Topics,
        publish_all: Callable[[str, Sequence[tuple[Message, str | None]]], Awaitable[None]],
        publish_records: PublishRecords,
        dead_letter: DeadLetter,
        batch_full_records: int = 500,
        settle_s: float = 2.0,
        lease_s: float = 10.0,
    ) -> None:
        self.book = book
        self.ledger = ledger
        self.budgets = budgets
        self.store = store
        self.topics = topics
        self.publish_all = publish_all
        self.publish_records = publish_records
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
        self.replica_id = uuid.uuid4().hex
        self.lease_ms = int(lease_s * 1000)
        self._owned: set[str] = set()  # workers whose GPU time this replica prices (their leases)
        self._adopt: set[str] = set()  # owned since the last tick: state taken from Redis first
        # Set at start and when billing failed midway: the outbox is published and applied before
        # anything else is billed.
        self._recover = True

    async def restore(self) -> None:
        """After the heartbeat table is read: the outbox billed. Held results and cursors come back per
        worker when this replica takes the worker's lease (the first tick, for a single replica)."""
        await self.recover()

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
        payloads: dict[RequestKey, bytes] = {}  # request -> the result as it came (held as it is)
        for record in raw:
            try:
                result = decode(record, InferenceResult)
            except BadMessage as exc:
                await self.dead_letter(record, exc)
            else:
                results.append(result)
                payloads[result.request_key] = record.value or b""
        await self.recover()
        seen = await self.store.seen(results)
        costed: list[CostRecord] = []
        served: list[ServedRequest] = []
        fresh: set[RequestKey] = set()
        outcomes: dict[str, int] = defaultdict(int)
        for result, was_seen in zip(results, seen, strict=True):
            if was_seen or result.request_key in fresh:
                outcomes["duplicate"] += 1
                continue
            fresh.add(result.request_key)
            priced = price_result(result, self.book)
            if isinstance(priced, ServedRequest):
                served.append(priced)
                outcomes["held"] += 1
            else:
                costed.append(priced)
                outcomes[priced.kind.value] += 1
        # Held durably (and marked seen) before the ledger takes them: a crash loses nothing.
        await self.store.hold([(s.result, payloads[s.result.request_key]) for s in served])
        # A worker another replica prices: its owner reads the result from where it is held.
        mine = [s for s in served if s.worker_id in self._owned or s.worker_id not in self.ledger.workers]
        late = self.ledger.add_all(mine)
        await self._bill(costed)
        if late:
            await self._bill(late)
            await self.store.release(late, {})
        for outcome, n in outcomes.items():  # counted once billed (the bench reads this)
            metrics.RESULTS.labels(outcome).inc(n)

    async def tick(self, now_ms: int, expiry_ms: int) -> int:
        """Close the ledger's final intervals of the workers this replica owns; bill what they priced.
        Returns records billed."""
        known = sorted({life.worker_id for life in [*self.ledger.retired, *self.ledger.workers.values()]})
        owned = await self.store.lease(known, self.replica_id, self.lease_ms)
        self._adopt = (self._adopt | (owned - self._owned)) & owned
        self._owned = owned
        if time.monotonic() < self._busy_until_s:
            return 0
        await self.recover()
        for worker_id in sorted(self._adopt):  # a restart, or taking over from another replica
            self.ledger.forget(worker_id)
            if (cursor := await self.store.cursor(worker_id)) is not None:
                self.ledger.restore(worker_id, cursor)
        self._adopt = set()
        records = await self._take_held(sorted(owned))
        records += self.ledger.close(now_ms, expiry_ms, owns=owned.__contains__)
        if records:
            await self._bill(records)
            # Only the owned workers' cursors: another replica's are that replica's to save.
            lives = [life for life in [*self.ledger.retired, *self.ledger.workers.values()] if life.worker_id in owned]
            await self.store.release(records, {life.worker_id: life.cursor() for life in lives})
        metrics.LATE_RESULTS.inc(self.ledger.late_results - self._late_reported)
        self._late_reported = self.ledger.late_results
        return len(records)

    async def _take_held(self, worker_ids: list[str]) -> list[CostRecord]:
        """The owned workers' results held by any replica and not yet in this ledger (late ones priced now)."""
        records: list[CostRecord] = []
        for worker_id, held in (await self.store.held_ids(worker_ids)).items():
            if new_ids := sorted(held - self.ledger.pending_ids(worker_id)):
                results = await self.store.held_results(worker_id, new_ids)
                # (the handler of llm.results may have added some meanwhile: the ledger takes each once)
                served = [s for r in results if isinstance(s := price_result(r, self.book), ServedRequest)]
                records += self.ledger.add_all(served)
        return records

    async def recover(self) -> None:
        """Bill the outbox: records staged by a run (or an attempt) that stopped before applying them.

        Each is published again exactly as staged (a copy may already be on llm.costs: the same
        bytes) and applied once; the results they price are then seen and will not be priced again.
        """
        if not self._recover:
            return
        self._recover = False  # before reading: a failure of a concurrent bill from now on sets it again
        try:
            staged = await self.store.staged()
            records = [CostRecord.model_validate_json(payload) for payload in staged]
            if records:
                log.warning("billing %d records staged before a restart or a failure", len(records))
                await self._publish_and_apply(records, staged)
                await self.store.release(records, {})
        except BaseException:
            self._recover = True
            raise

    async def _bill(self, records: list[CostRecord]) -> None:
        """Stage, publish, apply (see the module's docstring for why each crash point bills once)."""
        if not records:
            return
        try:
            # A record id billed before (a restart closing an interval again from the cursor saved
            # after the last release) stays as it was staged and published: not a second version.
            staged = await self.store.stage(records, [r.to_bytes() for r in records])
            if staged:
                await self._publish_and_apply([r for r, _ in staged], [p for _, p in staged])
        except BaseException:
            self._recover = True  # whatever of it was staged is billed before anything else
            raise

    async def _publish_and_apply(self, records: list[CostRecord], payloads: list[bytes]) -> None:
        # Keyed by record id (llmbus.contract.topics: a big tenant spreads; nothing reads one tenant's in order).
        keyed = [(r, p, r.record_id or r.request_id) for r, p in zip(records, payloads, strict=True)]
        await self.publish_records(keyed)
        applied = await self.store.bill(records)
        await self._check_budgets(self._count(records, applied))

    def _count(self, records: list[CostRecord], applied: list[bool]) -> dict[str, int]:
        """Metrics of the records applied now, and the tenants whose budgets to check."""
        # Grouped per label set first (one step per record), then summed per group: a backlog batch
        # has thousands of records and few label sets.
        groups: dict[tuple[BookedTo, str, str, CostKind], list[CostRecord]] = defaultdict(list)
        for record, new in zip(records, applied, strict=True):
            if new:
                groups[(record.booked_to, record.tenant, record.model, record.kind)].append(record)
        tenants: dict[str, int] = {}
        for (booked_to, tenant, model, kind), group in groups.items():
            who = tenant if booked_to == BookedTo.TENANT else f"_{booked_to.value}"
            metrics.cost_usd(who, model, kind.value).inc(usd(sum(r.cost_micro_usd for r in group)))
            metrics.tokens(who, model, "prompt").inc(sum(r.prompt_tokens for r in group))
            metrics.tokens(who, model, "completion").inc(sum(r.completion_tokens for r in group))
            if saving_micro := sum(r.saving_micro_usd for r in group):
                metrics.saving_usd(who, model).inc(usd(saving_micro))
            if booked_to == BookedTo.TENANT and tenant in self.budgets.tenants:
                tenants[tenant] = max(tenants.get(tenant, 0), *(r.booked_at_ms for r in group))
        return tenants

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
