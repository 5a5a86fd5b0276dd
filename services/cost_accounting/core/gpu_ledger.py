"""Self-hosted cost: each worker's GPU time shared among the requests it served.

Time is cut into intervals of `interval_ms` aligned to the epoch (they tile every UTC hour:
3,600,000 is a multiple of interval_ms). In each interval the worker's alive time is
  cold    — from process start to ready (cold start),
  busy    — covered by at least one request's engine span (start = completed - engine_ms),
  idle    — the rest;
and its cost is the worker's instance rate times alive time, rounded *telescopically within
the hour* (cost of [a, b) = R(alive ms from the hour's start to b) - R(... to a), R rounding
half to even to the micro-dollar), so the intervals of an hour add up to exactly
R(instance-ms in the hour x rate). The interval's cost is split by milliseconds into cold /
busy / idle, and busy is split among the requests active in the interval by their share of
the work done in it: (prefill tokens x prefill weight + decode tokens x decode weight) of
each request, spread evenly over its span. All splits are largest-remainder on integers, so
    per worker and hour:  sum(requests' GPU shares) + idle + cold-start time = instance-hours x price
to the micro-dollar, hence to the cent. Cold start is then amortised: the first
`cold_start_requests` requests the instance serves (in completion order) each pay an equal
integer share of it; if the instance stops before serving that many, the unpaid rest is a
COLD_START_WASTE record. Over a worker's life:
    sum(request costs) + sum(idle) + cold-start waste = instance-hours x price.

When intervals close (finalisation): an interval [a, b) closes once the worker's own clock
(heartbeat sent_at_ms) has passed b + grace_ms — results of requests active in it have had
`grace_ms` to arrive — and a heartbeat sent at some t >= b, itself grace_ms old, says no request
that started before b was still running then (`oldest_running_started_at_ms` >= b, or none):
a request longer than interval + grace holds the intervals it runs in open until its result
can be there, so it pays for every interval it ran in, not only its last (held at most
`max_hold_ms`: an engine stuck on a request does not stop billing). For a worker that stopped
(STOPPED heartbeat) or fell silent (no heartbeat for expiry), intervals close once the
caller's clock has passed its end + grace_ms; then everything up to its end closes and its
cold-start waste is booked. A request's record is
published when the interval holding its completion closes. A result that arrives for an
interval already closed is a late result: it is priced at the cost of its cold-start share
only and counted (`late_results`), because that GPU time was already booked (after the
worker's life has closed, the cold start is booked too, so it is priced at 0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from llmbus.contract.messages import BookedTo, CostKind, CostRecord, WorkerState, WorkerStatus
from llmbus_services.cost_accounting.core.costing import PLATFORM_TENANT, ServedRequest, base_record
from llmbus_services.cost_accounting.core.money import split, usd
from llmbus_services.cost_accounting.core.prices import MS_PER_HOUR, PriceBook, SelfHostedRate

Cursor = dict[str, Any]
PRICED_LATE_KEPT = 100_000  # record ids of late results remembered (oldest forgotten first)


@dataclass
class WorkerLife:
    worker_id: str
    pool: str
    rate: SelfHostedRate
    started_at_ms: int
    ready_at_ms: int | None = None
    last_seen_ms: int = 0
    ended: bool = False  # stopped, or expired
    closed_until_ms: int = 0  # intervals ending at or before this are closed
    cold_micro_total: int = 0
    cold_paid_requests: int = 0
    cold_paid_micro: int = 0
    waste_booked: bool = False
    cold_start_phases_s: dict[str, float] = field(default_factory=dict)  # from the heartbeat, for the waste record
    pending: list[ServedRequest] = field(default_factory=list)
    running_micro: dict[str, int] = field(default_factory=dict)  # request key -> GPU share so far
    busy_ms: dict[str, float] = field(default_factory=dict)
    # (heartbeat sent_at_ms, oldest running request's start or None), from closed_until_ms on
    running_log: list[tuple[int, int | None]] = field(default_factory=list)

    def cursor(self) -> Cursor:
        """What must survive a restart or a change of owner (the rest comes back from heartbeats and
        the held results): with the GPU time already priced for requests whose last interval is open."""
        return {
            "started_at_ms": self.started_at_ms,
            "closed_until_ms": self.closed_until_ms,
            "cold_micro_total": self.cold_micro_total,
            "cold_paid_requests": self.cold_paid_requests,
            "cold_paid_micro": self.cold_paid_micro,
            "waste_booked": self.waste_booked,
            "running": {rid: [micro, self.busy_ms.get(rid, 0.0)] for rid, micro in self.running_micro.items()},
        }


@dataclass(frozen=True)
class IntervalBill:
    """One closed interval of one worker: the conservation law holds on each."""

    worker_id: str
    start_ms: int
    end_ms: int
    alive_ms: int
    cost_micro: int
    cold_micro: int
    idle_micro: int
    shares_micro: dict[str, int]


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


def _union_ms(spans: list[tuple[int, int]]) -> int:
    total, cur_start, cur_end = 0, None, None
    for s, e in sorted(spans):
        if cur_end is None or s > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


class GpuLedger:
    def __init__(
        self,
        book: PriceBook,
        *,
        interval_ms: int = 60_000,
        grace_ms: int = 30_000,
        cold_start_requests: int = 100,
        prefill_token_weight: float = 0.25,
        decode_token_weight: float = 1.0,
        keep_bills: bool = False,
        max_hold_ms: int = 1_800_000,
    ) -> None:
        if interval_ms <= 0 or MS_PER_HOUR % interval_ms:
            raise ValueError("interval_ms must divide an hour (3,600,000 ms)")
        self.book = book
        self.interval_ms = interval_ms
        self.grace_ms = grace_ms
        self.cold_start_requests = cold_start_requests
        self.prefill_w = prefill_token_weight
        self.decode_w = decode_token_weight
        self.max_hold_ms = max_hold_ms
        self.workers: dict[str, WorkerLife] = {}
        self.keep_bills = keep_bills  # tests check every closed interval; the service does not keep them
        self.bills: list[IntervalBill] = []
        self.retired: list[WorkerLife] = []  # earlier processes of a restarted worker id, until closed
        self.orphans: list[ServedRequest] = []  # results whose worker has not been seen yet
        # Record ids priced as late results lately: a tick that reads them from Redis before the handler that
        # priced them released them there must not price them again (most of them are legs of continued
        # answers whose worker died: its intervals close before the answer's result comes).
        self.priced_late: dict[str, None] = {}
        self.late_results = 0
        self.orphaned_results = 0

    # -- inputs --------------------------------------------------------------------------------
    def observe(self, status: WorkerStatus) -> WorkerLife | None:
        """A heartbeat: the worker's life (start, ready, last seen, end). None: not a priced pool."""
        pool = self.book.pool_of(status.models[0] if status.models else None, status.worker_id)
        if pool is None:
            return None
        life = self.workers.get(status.worker_id)
        if life is None or status.started_at_ms > life.started_at_ms:  # new worker, or the id restarted
            if life is not None:
                life.ended = True  # the old process is gone; its end is its last heartbeat
                self.retired.append(life)
            life = WorkerLife(status.worker_id, pool, self.book.pool_rate(pool), status.started_at_ms)
            life.closed_until_ms = self._floor(status.started_at_ms)
            life.last_seen_ms = status.started_at_ms
            self.workers[status.worker_id] = life
        elif status.started_at_ms < life.started_at_ms:
            return life  # a heartbeat of an earlier process with the same id: its life is closed
        if status.cold_start_s is not None and life.ready_at_ms is None:
            life.ready_at_ms = life.started_at_ms + round(status.cold_start_s * 1000)
        if status.cold_start_phases_s:
            life.cold_start_phases_s = dict(status.cold_start_phases_s)
        if not life.running_log or status.sent_at_ms > life.running_log[-1][0]:
            life.running_log.append((status.sent_at_ms, status.oldest_running_started_at_ms))
        life.last_seen_ms = max(life.last_seen_ms, status.sent_at_ms)
        if status.state == WorkerState.STOPPED:
            life.ended = True
        if self.orphans:
            waiting, self.orphans = self.orphans, []
            for served in waiting:
                (life.pending if served.worker_id == life.worker_id else self.orphans).append(served)
        return life

    def add(self, served: ServedRequest) -> list[CostRecord]:
        """A self-hosted result: held until its intervals close ([]), or priced now if it is late."""
        return self.add_all([served])

    def add_all(self, served: Iterable[ServedRequest]) -> list[CostRecord]:
        """Results, each taken once: one already waiting here is not taken again.

        The handler of llm.results adds what it holds, and a tick adds what it finds held and not
        here -- both, when the tick read while the handler was between the two. Twice pending, a
        result was priced twice under one record id (the second copy at 0, its share gone)."""
        taken: dict[str, set[str]] = {}  # worker id -> request keys waiting (read once per worker)
        records: list[CostRecord] = []
        for one in served:
            if (ids := taken.get(one.worker_id)) is None:
                ids = taken[one.worker_id] = self.pending_ids(one.worker_id)
            if one.key not in ids and one.key not in self.priced_late:
                ids.add(one.key)
                records += self._add(one)
        return records

    def _add(self, served: ServedRequest) -> list[CostRecord]:
        life = self._life_for(served)
        if life is None:  # no heartbeat of its worker yet: wait for one (or for expiry, in close)
            self.orphans.append(served)
            return []
        if served.end_ms <= life.closed_until_ms or (life.waste_booked and life.ended):
            return [self._late_record(life, served)]
        life.pending.append(served)
        return []

    def _life_for(self, served: ServedRequest) -> WorkerLife | None:
        life = self.workers.get(served.worker_id)
        if life is not None and served.end_ms <= life.started_at_ms:  # served by an earlier process of that id
            return next(
                (
                    old
                    for old in self.retired
                    if old.worker_id == served.worker_id and old.started_at_ms < served.end_ms
                ),
                life,
            )
        return life

    def restore(self, worker_id: str, cursor: Cursor) -> None:
        life = self.workers.get(worker_id)
        if life is None or life.started_at_ms != cursor["started_at_ms"]:
            return
        life.closed_until_ms = int(cursor["closed_until_ms"])
        life.cold_micro_total = int(cursor["cold_micro_total"])
        life.cold_paid_requests = int(cursor["cold_paid_requests"])
        life.cold_paid_micro = int(cursor["cold_paid_micro"])
        life.waste_booked = bool(cursor["waste_booked"])
        running = cursor.get("running", {})
        life.running_micro = {rid: int(micro) for rid, (micro, _) in running.items()}
        life.busy_ms = {rid: float(busy) for rid, (_, busy) in running.items()}

    def skip_closed(self, worker_id: str, before_ms: int) -> None:
        """A worker whose cursor a Redis data loss took: the intervals ending by `before_ms` were
        closed by the run before (their records are on llm.costs) and are not closed again."""
        for life in [*self.retired, *self.workers.values()]:
            if life.worker_id == worker_id:
                life.closed_until_ms = max(life.closed_until_ms, self._floor(before_ms))

    def forget(self, worker_id: str) -> None:
        """Another replica owns this worker now: what was held for it here is theirs (and in Redis)."""
        for life in [*self.retired, *self.workers.values()]:
            if life.worker_id == worker_id:
                life.pending.clear()
                life.running_micro.clear()
                life.busy_ms.clear()

    def pending_ids(self, worker_id: str) -> set[str]:
        """The request keys of the worker's results waiting here for their intervals (its orphans included)."""
        waiting = [
            r for life in [*self.retired, *self.workers.values()] if life.worker_id == worker_id for r in life.pending
        ]
        return {r.key for r in [*waiting, *self.orphans] if r.worker_id == worker_id}

    # -- closing -------------------------------------------------------------------------------
    def close(
        self, now_ms: int, expiry_ms: int = 30_000, owns: Callable[[str], bool] | None = None
    ) -> list[CostRecord]:
        """Close every interval that is final at `now_ms`; return the records now complete.

        `owns`: which workers this ledger prices (one owner per worker among replicas); None: all."""
        records: list[CostRecord] = []
        for life in [*self.retired, *self.workers.values()]:
            if not life.ended and now_ms - life.last_seen_ms > expiry_ms:
                life.ended = True
            if owns is not None and not owns(life.worker_id):
                self.forget(life.worker_id)  # its owner reads them from where they are held
                continue
            if life.ended:
                if now_ms < life.last_seen_ms + self.grace_ms:
                    continue
                limit = life.last_seen_ms
            else:
                limit = life.last_seen_ms - self.grace_ms
            records.extend(self._close_worker(life, limit))
        # A retired life another replica owns is closed there: dropped here once it surely has been.
        self.retired = [
            life
            for life in self.retired
            if not life.waste_booked
            and (owns is None or owns(life.worker_id) or now_ms - life.last_seen_ms < expiry_ms + 2 * self.grace_ms)
        ]
        stale = [r for r in self.orphans if now_ms - r.end_ms > expiry_ms + self.grace_ms]
        if stale:  # a worker never seen on llm.workers: its results cannot be priced by GPU time
            self.orphans = [r for r in self.orphans if now_ms - r.end_ms <= expiry_ms + self.grace_ms]
            self.orphaned_results += len(stale)
            records.extend(base_record(r.result, self.book, CostKind.UNPRICED, 0, r.priced) for r in stale)
        return records

    def _floor(self, t_ms: int) -> int:
        return t_ms - t_ms % self.interval_ms

    def _settled(self, life: WorkerLife, b: int, limit_ms: int) -> bool:
        """No request that started before b can still end without its result being here by limit_ms."""
        if life.ended or limit_ms - b >= self.max_hold_ms:
            return True
        return any(b <= sent <= limit_ms and (oldest is None or oldest >= b) for sent, oldest in life.running_log)

    def _close_worker(self, life: WorkerLife, limit_ms: int) -> Iterator[CostRecord]:
        end_ms = life.last_seen_ms
        while (
            life.closed_until_ms + self.interval_ms <= limit_ms
            and self._settled(life, life.closed_until_ms + self.interval_ms, limit_ms)
        ) or (life.ended and life.closed_until_ms < end_ms and limit_ms >= end_ms):
            start = life.closed_until_ms
            yield from self._close_interval(life, start, start + self.interval_ms)
            life.closed_until_ms = start + self.interval_ms
        if len(life.running_log) > 1:  # only heartbeats from the first open interval's end on can settle it
            keep_from = life.closed_until_ms + self.interval_ms
            life.running_log = [e for e in life.running_log[:-1] if e[0] >= keep_from] + life.running_log[-1:]
        if life.ended and life.closed_until_ms >= end_ms and not life.waste_booked:
            life.waste_booked = True
            for served in life.pending:  # results of the dead worker that arrived after all closed
                yield self._late_record(life, served)
            life.pending.clear()
            waste = life.cold_micro_total - life.cold_paid_micro
            if waste > 0:
                record = self._platform_record(
                    life,
                    CostKind.COLD_START_WASTE,
                    waste,
                    f"waste:{life.worker_id}:{life.started_at_ms}",
                    life.started_at_ms,
                )
                # Which part of the start went unused (weights, CUDA graphs, warm-up) says what to shorten.
                yield record.model_copy(update={"cold_start_phases_s": life.cold_start_phases_s})

    def _alive_ms(self, life: WorkerLife, a: int, b: int) -> int:
        """A live worker is alive through every interval it closes (its clock is past b + grace)."""
        return _overlap(life.started_at_ms, life.last_seen_ms if life.ended else b, a, b)

    def _close_interval(self, life: WorkerLife, a: int, b: int) -> Iterator[CostRecord]:
        hour = a - a % MS_PER_HOUR
        alive = self._alive_ms(life, a, b)
        cost = life.rate.cost_micro(self._alive_ms(life, hour, b)) - life.rate.cost_micro(self._alive_ms(life, hour, a))
        ready = life.ready_at_ms if life.ready_at_ms is not None else max(b, life.last_seen_ms)
        cold_ms = min(alive, _overlap(life.started_at_ms, ready, a, b))
        serve_lo, serve_hi = max(a, ready, life.started_at_ms), min(b, life.last_seen_ms if life.ended else b)
        active = [r for r in life.pending if r.start_ms < b and r.end_ms > a]
        clipped = [(max(r.start_ms, serve_lo), min(r.end_ms, serve_hi)) for r in active]
        clipped = [(s, e) for s, e in clipped if e > s]
        busy_ms = min(alive - cold_ms, _union_ms(clipped))
        cold_micro, busy_micro, idle_micro = split(cost, [cold_ms, busy_ms, alive - cold_ms - busy_ms])
        weights = []
        for r in active:
            lo, hi = max(r.start_ms, serve_lo), min(r.end_ms, serve_hi)
            work = r.prefill_tokens * self.prefill_w + r.decode_tokens * self.decode_w
            weights.append(max(work, 1e-9) * max(0, hi - lo) / (r.end_ms - r.start_ms))
            life.busy_ms[r.key] = life.busy_ms.get(r.key, 0.0) + max(0, hi - lo)
        if sum(weights) <= 0:  # requests touched the interval but none inside the serving span
            idle_micro += busy_micro
            busy_micro = 0
        shares = split(busy_micro, weights)
        for r, share in zip(active, shares, strict=True):
            life.running_micro[r.key] = life.running_micro.get(r.key, 0) + share
        life.cold_micro_total += cold_micro
        if self.keep_bills:
            shares_by_id: dict[str, int] = {r.key: s for r, s in zip(active, shares, strict=True)}
            bill = IntervalBill(life.worker_id, a, b, alive, cost, cold_micro, idle_micro, shares_by_id)
            self.bills.append(bill)
        if idle_micro:
            yield self._platform_record(life, CostKind.IDLE, idle_micro, f"idle:{life.worker_id}:{a}", a)
        done = sorted((r for r in life.pending if r.end_ms <= b), key=lambda r: (r.end_ms, r.key))
        if done:
            life.pending = [r for r in life.pending if r.end_ms > b]
            for r in done:
                yield self._request_record(life, r)

    def _cold_share(self, life: WorkerLife) -> int:
        k, n = life.cold_paid_requests, self.cold_start_requests
        # Once the waste is booked the whole cold start is accounted (paid + waste): a result of the
        # dead worker arriving later pays none of it, or the worker's life would be billed twice.
        if k >= n or life.cold_micro_total <= 0 or life.waste_booked:
            return 0
        share = life.cold_micro_total * (k + 1) // n - life.cold_micro_total * k // n
        life.cold_paid_requests += 1
        life.cold_paid_micro += share
        return share

    def _late_record(self, life: WorkerLife, served: ServedRequest) -> CostRecord:
        self.late_results += 1
        self.priced_late[served.key] = None
        while len(self.priced_late) > PRICED_LATE_KEPT:
            del self.priced_late[next(iter(self.priced_late))]
        return self._request_record(life, served)

    def _request_record(self, life: WorkerLife, served: ServedRequest) -> CostRecord:
        key = served.key
        running = life.running_micro.pop(key, 0)
        cold = self._cold_share(life)
        return base_record(
            served.result,
            self.book,
            CostKind.SELF_HOSTED,
            running + cold,
            served.priced,
            cold_start_micro_usd=cold,
            pool=life.pool,
            gpu=life.rate.gpu,
            capacity=life.rate.capacity.value,
            gpu_busy_ms=round(life.busy_ms.pop(key, 0.0), 3),
        )

    def _platform_record(self, life: WorkerLife, kind: CostKind, micro: int, record_id: str, at_ms: int) -> CostRecord:
        return CostRecord(
            record_id=record_id,
            request_id=record_id,
            tenant=PLATFORM_TENANT,
            model=",".join(pool.models) if (pool := self.book.pools.get(life.pool)) else life.pool,
            kind=kind,
            booked_to=BookedTo.PLATFORM,
            cost_micro_usd=micro,
            cost_usd=usd(micro),
            pool=life.pool,
            worker_id=life.worker_id,
            gpu=life.rate.gpu,
            capacity=life.rate.capacity.value,
            booked_at_ms=at_ms,
        )
