"""The GPU ledger's tick: the final intervals of the workers this replica owns closed and billed.

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

from aiokafka.structs import TopicPartition

from llmbus.contract.messages import (
    CostRecord,
    now_ms,
)
from llmbus_services.cost_accounting.adapters import metrics
from llmbus_services.cost_accounting.core.costing import served_parts
from llmbus_services.cost_accounting.flows.billing import HeldResult
from llmbus_services.cost_accounting.flows.write_loss import WriteLossFlow

log = logging.getLogger(__name__)


class LedgerFlow(WriteLossFlow):
    async def tick(self, now_ms: int, expiry_ms: int) -> int:
        """Close the ledger's final intervals of the workers this replica owns; bill what they priced.
        Returns records billed."""
        await self._check_state()
        await self.check_writes()  # Redis lost its last writes (a restart, a failover): made good from llm.costs
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
            elif self._floor_ms is not None and worker_id in self._floor_workers:
                self.ledger.skip_closed(worker_id, self._floor_ms)
        self._adopt = set()
        records = await self._take_held(sorted(owned))
        records += self.ledger.close(now_ms, expiry_ms, owns=owned.__contains__)
        if records:
            await self._bill(records)
            # Only the owned workers' cursors: another replica's are that replica's to save.
            lives = [life for life in [*self.ledger.retired, *self.ledger.workers.values()] if life.worker_id in owned]
            await self.store.release(records, {life.worker_id: life.cursor() for life in lives})
            self._release_open(records)
        await self._settle_others(owned)
        metrics.HELD_OPEN.set(len(self.holds))
        metrics.LATE_RESULTS.inc(self.ledger.late_results - self._late_reported)
        self._late_reported = self.ledger.late_results
        return len(records)

    async def _settle_others(self, owned: set[str]) -> None:
        """Results held open here for a worker another replica prices: released once it billed them
        (their record ids applied). Any held result older than the held results' TTL in Redis is
        released too: nothing could bill it any more, and it must not hold its partition back forever."""
        expired_ms = now_ms() - self.store.ttl_s * 1000
        others: list[tuple[TopicPartition, int, HeldResult, str]] = []  # a part another replica prices
        for tp, offset, held in self.holds.items():
            if held.written_ms < expired_ms:
                log.warning("result %s held past the TTL of held results: released unbilled", held.request_key)
                self.holds.release(tp, offset)
            else:
                others += [(tp, offset, held, key) for key, worker_id in held.parts.items() if worker_id not in owned]
        if not others:
            return
        applied = await self.store.applied([key for _, _, _, key in others])
        for (tp, offset, held, key), billed in zip(others, applied, strict=True):
            if billed:
                held.parts.pop(key, None)
                if not held.parts:
                    self.holds.release(tp, offset)

    async def _take_held(self, worker_ids: list[str]) -> list[CostRecord]:
        """The owned workers' results held by any replica and not yet in this ledger (late ones priced now)."""
        records: list[CostRecord] = []
        for worker_id, held in (await self.store.held_ids(worker_ids)).items():
            if new_ids := sorted(held - self.ledger.pending_ids(worker_id)):
                results = await self.store.held_results(worker_id, new_ids)
                # (the handler of llm.results may have added some meanwhile: the ledger takes each once)
                wanted = set(new_ids)
                parts = (s for r in results for s in served_parts(r, self.book))
                records += self.ledger.add_all([s for s in parts if s.worker_id == worker_id and s.key in wanted])
        return records
