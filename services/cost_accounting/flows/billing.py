"""The billing flow: llm.results -> CostRecords, billed in three steps per batch (`_bill`):
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

Held results are also held open on llm.results (llmbus.bus.holds): the committed offset of a
partition never passes a self-hosted result that is not billed yet, so llm.results itself is the
durable copy of everything held in Redis. What Redis data loss (a flush, a crash without fsync)
takes is then rebuilt from Kafka, by one rule: everything from the oldest unbilled result on is
read again, and what was billed is known from llm.costs (the book of record). Each replica keeps
the id of the state it started on (`cost:state`); when it is gone or changed (`_check_state`, at
start and every tick) the replica writes the once-only markers of every record on llm.costs from
`margin` before its oldest held result (or, at start, before the oldest record its group will read
again) back into Redis, holds its held results there again from memory, and takes up workers whose
cursor is gone from that time (`GpuLedger.skip_closed`: earlier intervals were closed and billed) --
the workers it knew then; one first heard of later has had no interval closed. At start an unset id
is a loss only if records were on llm.costs before this replica set the new id: replicas starting
together all find none, and the first to set it may bill before another reads llm.costs. The id
set after a loss carries that time, for every replica that starts on it.
Why each crash point bills once:
  - a flush, the process running on: the ledger still has its results and cursors in memory; the
    held results are written back; a later restart finds the markers (above) and the held ones.
  - a flush, then a crash (before or after the rebuild): the restart reads llm.results again from
    the commit point, which is at or before the oldest unbilled held result; the markers rebuilt
    from llm.costs skip every result billed before, so exactly the unbilled ones are priced, and
    the intervals they are in had not closed (their requests were all held), so they are priced as
    they would have been. A crash during the rebuild leaves the state id unset: done again.
  - no loss, a crash: the commit point is at the oldest held result; results read again that are
    seen and still held are held open again, the rest skipped as before.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiokafka.structs import ConsumerRecord

from llmbus.bus.codec import BadMessage, decode
from llmbus.bus.holds import Holds
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    BookedTo,
    BudgetStatus,
    CostKind,
    CostRecord,
    InferenceResult,
    Message,
    now_ms,
)
from llmbus.contract.request_key import RequestKey
from llmbus_services.cost_accounting.adapters import metrics
from llmbus_services.cost_accounting.adapters.publishing import Items
from llmbus_services.cost_accounting.adapters.store import CostStore, loss_floor_ms
from llmbus_services.cost_accounting.core import budgets as b
from llmbus_services.cost_accounting.core.aggregates import agg_key
from llmbus_services.cost_accounting.core.costing import ServedRequest, price_parts, served_parts
from llmbus_services.cost_accounting.core.gpu_ledger import GpuLedger
from llmbus_services.cost_accounting.core.money import usd
from llmbus_services.cost_accounting.core.prices import PriceBook

log = logging.getLogger(__name__)

DeadLetter = Callable[[ConsumerRecord, Exception], Awaitable[None]]
PublishRecords = Callable[[Items], Awaitable[None]]
BilledSince = Callable[[int], Awaitable[list[CostRecord]]]  # llm.costs from a time (ms) on
ResumeAt = Callable[[], Awaitable[int | None]]  # when the oldest record llm.results gives again was written


@dataclass
class HeldResult:
    """A self-hosted result held open on llm.results until every part the GPU ledger prices is billed: the
    result, or each self-hosted leg of a continued answer (record id → its worker, while not billed)."""

    request_key: str
    parts: dict[str, str]
    payload: bytes  # as read: written back to Redis after a data loss
    written_ms: int  # the record's timestamp

    def held(self) -> list[tuple[str, str, str, bytes]]:
        """(worker id, record id, request key, payload) of each part still held: what Redis holds of it."""
        return [(worker_id, key, self.request_key, self.payload) for key, worker_id in self.parts.items()]


class BillingFlow:
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
        billed_since: BilledSince | None = None,
        resume_at: ResumeAt | None = None,
    ) -> None:
        self.book = book
        self.ledger = ledger
        self.budgets = budgets
        metrics.learn_price_book(book, budgets.tenants)
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
        self.holds: Holds[HeldResult] = Holds()
        self.billed_since = billed_since
        self.resume_at = resume_at
        self._state_id: str | None = None
        self._floor_ms: int | None = None  # after a data loss: where lives without a cursor start
        self._floor_workers: set[str] = set()  # the workers known then (the floor is theirs only)

    async def restore(self) -> None:
        """After the heartbeat table is read: the markers rebuilt if Redis lost them, the outbox billed.
        Held results and cursors come back per worker when this replica takes the worker's lease (the
        first tick, for a single replica)."""
        await self.store.adopt_untagged_keys()  # keys from before their hash tag: moved once, before any bill
        await self._check_state(starting=True)
        await self.recover()

    async def _check_state(self, starting: bool = False) -> None:
        """If Redis lost its state (the state id gone, or another than this replica's): rebuild.

        At start an unset id is a loss, the first start of all, or another replica starting at the same
        moment: only the replica that sets the new id judges which, by what llm.costs held before."""
        state = await self.store.state_id()
        if state is not None and (self._state_id is None or state == self._state_id):
            if self._state_id is None:  # started on a state set after a loss: workers start where it says
                self._set_floor(loss_floor_ms(state))
            self._state_id = state
            return
        lost = state is not None or self._state_id is not None  # changed, or gone since this replica saw it
        if not (lost or starting):  # never set (handlers driven without `restore`): nothing to rebuild
            self._state_id, _ = await self.store.mark_state()
            return
        oldest = await self.resume_at() if starting and self.resume_at is not None else None
        oldest = min((v.written_ms for _, _, v in self.holds.items()), default=oldest)
        margin_ms = self.ledger.interval_ms + self.ledger.grace_ms
        since_ms = (oldest if oldest is not None else now_ms()) - margin_ms
        # Read before the new id is set: every record in it was billed before any replica could start
        # on this state. Its markers are written back whoever sets the id (they are true either way),
        # and before it, so a replica starting on the new id finds them.
        billed = await self.billed_since(since_ms) if self.billed_since is not None else []
        await self.store.restore_billed(billed)
        await self.store.hold_raw([part for _, _, v in self.holds.items() for part in v.held()])
        self._state_id, won = await self.store.mark_state(since_ms if lost or billed else None)
        if not (lost or won):  # another replica set the id since this one found none: its judgement holds
            self._set_floor(loss_floor_ms(self._state_id))
            return
        # Records billed before the first start on this state, or a state gone while this replica ran:
        # workers whose cursor is gone start at `since_ms`, where intervals before it were closed.
        if lost or billed:
            self._set_floor(since_ms)
            metrics.STATE_REBUILDS.inc()
            log.warning(
                "Redis lost cost-accounting's state: %d billed records from llm.costs marked again, %d held "
                "results held again; results from %d on are read again",
                len(billed),
                len(self.holds),
                since_ms,
            )

    def _set_floor(self, floor_ms: int | None) -> None:
        """After a loss: where lives without a cursor start -- only the workers the ledger knows now.
        A worker first heard of later had no life any run could close an interval of before the loss
        (the ledger closes only lives it has heard from): its intervals are all still to bill."""
        if floor_ms is None:
            return
        self._floor_ms = floor_ms
        self._floor_workers = {life.worker_id for life in [*self.ledger.retired, *self.ledger.workers.values()]}

    async def on_results(self, raw: Sequence[ConsumerRecord]) -> None:
        if len(raw) >= self.batch_full_records:
            self._busy_until_s = time.monotonic() + self.settle_s
        results: list[InferenceResult] = []
        records: list[ConsumerRecord] = []
        payloads: dict[RequestKey, bytes] = {}  # request -> the result as it came (held as it is)
        for record in raw:
            try:
                result = decode(record, InferenceResult)
            except BadMessage as exc:
                await self.dead_letter(record, exc)
            else:
                results.append(result)
                records.append(record)
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
            for priced in price_parts(result, self.book):  # a continued answer: one per leg, its own last
                if isinstance(priced, ServedRequest):
                    served.append(priced)
                else:
                    costed.append(priced)
            outcomes["held" if isinstance(priced, ServedRequest) else priced.kind.value] += 1
        # Held durably (and marked seen) before the ledger takes them: a crash loses nothing.
        await self.store.hold([(s, payloads[s.result.request_key]) for s in served])
        await self._hold_open(records, results, seen, served)
        # A worker another replica prices: its owner reads the result from where it is held.
        mine = [s for s in served if s.worker_id in self._owned or s.worker_id not in self.ledger.workers]
        late = self.ledger.add_all(mine)
        await self._bill(costed)
        if late:
            await self._bill(late)
            await self.store.release(late, {})
            self._release_open(late)
        for outcome, n in outcomes.items():  # counted once billed (the bench reads this)
            metrics.RESULTS.labels(outcome).inc(n)

    async def _hold_open(
        self,
        records: list[ConsumerRecord],
        results: list[InferenceResult],
        seen: list[bool],
        served: list[ServedRequest],
    ) -> None:
        """Every self-hosted result held in Redis is held open on llm.results too: the ones held now
        (`served`), and those read again (after a restart) that are seen and still held, with the parts
        (record ids) still held of each."""
        parts: dict[RequestKey, dict[str, str]] = {}
        for s in served:
            parts.setdefault(s.result.request_key, {})[s.key] = s.worker_id
        again = [
            (record, result, {s.key: s.worker_id for s in served_parts(result, self.book)})
            for record, result, was_seen in zip(records, results, seen, strict=True)
            if was_seen and result.worker_id
        ]
        asked = [(worker_id, key) for _, _, held in again for key, worker_id in held.items()]
        still = iter(await self.store.still_held(asked))
        for _, result, held in again:
            if kept := {key: worker_id for key, worker_id in held.items() if next(still)}:
                parts[result.request_key] = kept
        for record, result in zip(records, results, strict=True):
            if (held_parts := parts.pop(result.request_key, None)) is not None:
                value = HeldResult(result.request_key, held_parts, record.value or b"", record.timestamp)
                self.holds.hold(record, value)

    def _release_open(self, records: list[CostRecord]) -> None:
        """Billed: the parts these records price are no longer held; a result with none left is released
        (its offset may commit)."""
        billed = {r.record_id for r in records}
        for tp, offset, held in self.holds.items():
            for key in billed & held.parts.keys():
                del held.parts[key]
            if not held.parts:
                self.holds.release(tp, offset)

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
