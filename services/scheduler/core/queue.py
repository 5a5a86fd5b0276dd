"""Flow control: requests no worker can take now wait here instead of being lost.

One queue per model. Order: priority first (0 = most urgent); within a priority, tenants
take turns (round-robin, so one busy tenant cannot starve the others); within a tenant,
earliest deadline first, then arrival. Requests past their deadline (or past
`max_wait_ms` when they have none) come out of `expire` as timeouts. The queues are
bounded: `FlowQueues.admit` refuses beyond `max_queued` per model and beyond
`max_queued_per_tenant` per tenant over all models (one tenant cannot fill the scheduler's
shared slots), and the caller answers QUEUE_FULL (the fleet's capacity) or RATE_LIMITED (the
tenant's own). Empty queues are dropped (`prune`), so model names seen once do not stay forever.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from llmbus.contract.request_key import RequestKey
from llmbus_services.scheduler.core.types import SchedRequest

_NO_DEADLINE = 2**62


@dataclass(frozen=True)
class QueueRefusal:
    """Why a request was not queued: its tenant's own cap (`tenants_own`), or the model's queue is full."""

    reason: str
    tenants_own: bool


@dataclass
class _Level:
    """One priority level: a sorted list per tenant, and the tenants' turn order."""

    tenants: dict[str, list[tuple[int, int, SchedRequest]]] = field(default_factory=dict)
    turn: list[str] = field(default_factory=list)  # tenants in round-robin order; head goes next


class ModelQueue:
    def __init__(self, max_queued: int = 1000, max_wait_ms: int = 60_000) -> None:
        self.max_queued = max_queued
        self.max_wait_ms = max_wait_ms
        self._levels: dict[int, _Level] = {}
        self._ids: dict[RequestKey, SchedRequest] = {}
        self._per_tenant: dict[str, int] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, key: RequestKey) -> bool:
        return key in self._ids

    def count_of(self, tenant: str) -> int:
        return self._per_tenant.get(tenant, 0)

    def expires_at_ms(self, request: SchedRequest) -> int:
        wait_limit = request.arrived_at_ms + self.max_wait_ms
        return min(request.deadline_ms, wait_limit) if request.deadline_ms is not None else wait_limit

    def push(self, request: SchedRequest, force: bool = False) -> bool:
        """Queue the request; False when the queue is full (it was not queued).

        `force` skips the bound: a retry of a request we already accepted must not be lost.
        """
        if request.key in self._ids:
            return True
        if not force and len(self._ids) >= self.max_queued:
            return False
        level = self._levels.setdefault(request.priority, _Level())
        heap = level.tenants.get(request.tenant)
        if heap is None:
            heap = level.tenants[request.tenant] = []
            level.turn.append(request.tenant)
        deadline = request.deadline_ms if request.deadline_ms is not None else _NO_DEADLINE
        bisect.insort(heap, (deadline, next(self._seq), request), key=lambda e: (e[0], e[1]))
        self._ids[request.key] = request
        self._per_tenant[request.tenant] = self._per_tenant.get(request.tenant, 0) + 1
        return True

    def in_order(self) -> Iterator[SchedRequest]:
        """Every queued request in release order, without removing any (for trying placements)."""
        # Snapshots: callers remove requests (and so reorder tenants) while iterating.
        for _, level in sorted(self._levels.items(), key=lambda kv: kv[0]):
            turn = list(level.turn)
            lists = {t: list(level.tenants[t]) for t in turn}
            pos = dict.fromkeys(turn, 0)
            remaining = sum(len(entries) for entries in lists.values())
            while remaining:
                for tenant in turn:
                    i = pos[tenant]
                    if i < len(lists[tenant]):
                        pos[tenant] = i + 1
                        remaining -= 1
                        yield lists[tenant][i][2]

    def remove(self, key: RequestKey) -> SchedRequest | None:
        """Take a request out (placed, cancelled); its tenant goes to the back of the turn order."""
        request = self._ids.pop(key, None)
        if request is None:
            return None
        left = self._per_tenant[request.tenant] - 1
        if left:
            self._per_tenant[request.tenant] = left
        else:
            del self._per_tenant[request.tenant]
        level = self._levels[request.priority]
        heap = level.tenants[request.tenant]
        heap[:] = [entry for entry in heap if entry[2].key != key]
        level.turn.remove(request.tenant)
        if heap:
            level.turn.append(request.tenant)
        else:
            del level.tenants[request.tenant]
        if not level.tenants:
            del self._levels[request.priority]
        return request

    def release(self, try_place: Callable[[SchedRequest], bool], max_misses: int = 8) -> list[SchedRequest]:
        """Offer queued requests in order to `try_place`; remove those it took.

        Stops after `max_misses` refusals in a row: past that the fleet is full, and
        scanning further would only let small late requests overtake big early ones forever.
        """
        placed: list[SchedRequest] = []
        misses = 0
        for request in self.in_order():
            if try_place(request):
                self.remove(request.key)
                placed.append(request)
                misses = 0
            else:
                misses += 1
                if misses >= max_misses:
                    break
        return placed

    def expire(self, now_ms: int, wait_limit: bool = True) -> list[SchedRequest]:
        """Remove and return requests whose deadline (or wait limit) has passed.

        `wait_limit=False` ends only requests past their own deadline: the others keep waiting.
        """

        def late_at(r: SchedRequest) -> int | None:
            return self.expires_at_ms(r) if wait_limit else r.deadline_ms

        late = [r for r in self._ids.values() if (at := late_at(r)) is not None and now_ms >= at]
        for r in late:
            self.remove(r.key)
        return late


class FlowQueues:
    """The per-model queues, made on first use and dropped when empty."""

    def __init__(
        self, max_queued_per_model: int = 1000, max_wait_ms: int = 60_000, max_queued_per_tenant: int | None = None
    ) -> None:
        self.max_queued_per_model = max_queued_per_model
        self.max_wait_ms = max_wait_ms
        self.max_queued_per_tenant = max_queued_per_tenant
        self.by_model: dict[str, ModelQueue] = {}

    def of(self, model: str) -> ModelQueue:
        q = self.by_model.get(model)
        if q is None:
            q = self.by_model[model] = ModelQueue(self.max_queued_per_model, self.max_wait_ms)
        return q

    def holds(self, model: str, key: RequestKey) -> bool:
        q = self.by_model.get(model)
        return q is not None and key in q

    def queued_of(self, tenant: str) -> int:
        return sum(q.count_of(tenant) for q in self.by_model.values())

    def admit(self, request: SchedRequest, force: bool = False) -> QueueRefusal | None:
        """Queue the request; why it is refused (None: queued). `force` skips the bounds."""
        queue = self.of(request.model)
        if not force and request.key not in queue and (refused := self._over_tenant_cap(request.tenant)):
            return QueueRefusal(refused, tenants_own=True)
        if not queue.push(request, force=force):
            return QueueRefusal(f"{len(queue)} requests already wait for {request.model}", tenants_own=False)
        return None

    def _over_tenant_cap(self, tenant: str) -> str | None:
        cap = self.max_queued_per_tenant
        if cap is None or (held := self.queued_of(tenant)) < cap:
            return None
        return f"tenant {tenant!r} already has {held} requests waiting (at most {cap})"

    def prune(self) -> None:
        for model in [m for m, q in self.by_model.items() if not len(q)]:
            del self.by_model[model]

    def __len__(self) -> int:
        return sum(len(q) for q in self.by_model.values())

    def find(self, key: RequestKey) -> ModelQueue | None:
        return next((q for q in self.by_model.values() if key in q), None)
