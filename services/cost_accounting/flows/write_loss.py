"""Writes Redis acknowledged and then lost, noticed and made good from llm.costs.

Redis as deployed keeps an append-only file fsynced every second: a SIGKILL (an OOM killer, a crashed
host) loses up to the last second of writes, and a failover to a replica loses what the replica had not
received yet. Cost-accounting's state id (`cost:state`) survives such a loss, so the rebuild after a
data loss (billing.py) does not run; what is gone is the tail: records applied in that second (their
markers and their increments to the totals), results held or marked seen, ledger cursors saved.

Each replica writes its tick count (`cost:written:<replica>`) every tick. A count lower than the one it
wrote last, or none, says Redis lost the writes made since the tick it still shows. The replica then
reads llm.costs (the book of record) from that tick's time, less one tick, and applies every record
again by record id (`CostStore.bill`: a record whose marker is there is skipped, one whose apply was
lost is applied, with its increments, its result marked seen and its outbox entry dropped); what is
still staged is published and applied by the next `recover`. The totals that reports and budgets read
equal llm.costs again. What the running replica holds in memory (held results, the ledger's cursors)
was not lost with Redis and is written again as it goes.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from llmbus.contract.messages import now_ms
from llmbus_services.cost_accounting.adapters import metrics
from llmbus_services.cost_accounting.flows.billing import BillingFlow

log = logging.getLogger(__name__)
KEPT_TICKS = 3600  # ticks whose time is remembered: an hour at the shipped close_every_s


class WriteLossFlow(BillingFlow):
    _ticks: OrderedDict[int, int] | None = None  # tick → when it was written (ms); made at the first tick

    async def check_writes(self) -> None:
        """At every tick: the loss of this replica's recent writes noticed and made good, then this tick marked."""
        if self._ticks is None:
            self._ticks = OrderedDict()
        ticks = self._ticks
        last = next(reversed(ticks), 0)
        if last:
            held = await self.store.written(self.replica_id)
            if held is None or held < last:
                await self._apply_again(ticks, held, last)
        tick = last + 1
        await self.store.mark_written(self.replica_id, tick)
        ticks[tick] = now_ms()
        while len(ticks) > KEPT_TICKS:
            ticks.popitem(last=False)

    async def _apply_again(self, ticks: OrderedDict[int, int], held: int | None, last: int) -> None:
        oldest_ms = next(iter(ticks.values()))
        kept_ms = ticks.get(held, oldest_ms) if held is not None else oldest_ms
        since_ms = kept_ms - (ticks[last] - ticks.get(last - 1, ticks[last]))  # one tick's slack
        billed = await self.billed_since(since_ms) if self.billed_since is not None else []
        applied = await self.store.bill(billed)
        self._recover = True  # whatever is still staged: published and applied before the next bill
        metrics.WRITES_LOST.inc()
        log.warning(
            "Redis lost writes made after tick %s of %d: %d records on llm.costs since %d read, %d of them "
            "applied again (their markers and increments were gone)",
            held,
            last,
            len(billed),
            since_ms,
            sum(applied),
        )
