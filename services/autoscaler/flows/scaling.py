"""The scaling flow: heartbeats → the fleet table; pool statistics → policy → actuator.

Each scheduler instance sends one PoolStats per pool every few seconds; the merger combines
the instances' statistics of a pool (core/merge.py) and each merged PoolStats is one
evaluation of the pool's policy. A change is published as a ScaleDecision on llm.scaling (the
policy, the signal values, the reason) and then applied through the actuator; so are the
start-up moves that bring a pool to its minimum.

Each decision is applied once in effect: it is recorded before it is applied, and setting a
pool to N replicas is idempotent. A restart reads the pool's last decision back (`resume`) and
finishes applying it when the actuator's count differs, so a kill between the record and the
actuation neither loses the move nor leaves llm.scaling saying what never happened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llmbus.contract.messages import PoolStats, ReleaseContext, ScaleDecision, WorkerStatus, now_ms
from llmbus_services.autoscaler.adapters.actuators import Actuator
from llmbus_services.autoscaler.core import Decision, FleetTable, ScalingPolicy
from llmbus_services.autoscaler.core.config import PoolsFile, PoolSpec
from llmbus_services.autoscaler.core.merge import PoolStatsMerger

log = logging.getLogger(__name__)

PublishDecision = Callable[[ScaleDecision], Awaitable[None]]


@dataclass
class Pool:
    name: str
    spec: PoolSpec
    policy: ScalingPolicy


class AutoscalerHandlers:
    def __init__(
        self,
        pools: PoolsFile,
        actuator: Actuator,
        publish: PublishDecision,
        fleet: FleetTable,
        merger: PoolStatsMerger | None = None,
        stats_max_age_s: float = 30.0,
    ) -> None:
        self.pools = {name: Pool(name, spec, spec.build_policy()) for name, spec in pools.pools.items()}
        self.actuator = actuator
        self.publish = publish
        self.fleet = fleet
        self.merger = merger or PoolStatsMerger()
        self.stats_max_age_ms = int(stats_max_age_s * 1000)
        self._lock = asyncio.Lock()  # one evaluation and its actuation at a time

    async def on_worker(self, status: WorkerStatus) -> None:
        self.fleet.on_status(status)

    async def on_pool_stats(self, stats: PoolStats) -> ScaleDecision | None:
        pool = self.pools.get(stats.pool)
        if pool is None:
            return None  # not a pool this autoscaler manages
        age_ms = now_ms() - stats.sent_at_ms
        if age_ms > self.stats_max_age_ms:
            # Replayed after a restart or a lag: an hour-old queue is not a reason to scale now.
            log.info("%s: statistics %.0f s old skipped", stats.pool, age_ms / 1000)
            return None
        merged = self.merger.add(stats)
        if merged is None:
            return None  # another scheduler instance has yet to report this period
        stats = merged
        async with self._lock:
            current = await self.actuator.replicas(pool.name)
            decision = pool.policy.decide(self.fleet.signals(stats, now_ms()), current)
            return await self._apply(pool, decision, stats.release)

    async def reconcile(self, last: dict[str, ScaleDecision] | None = None, max_age_s: float = 600.0) -> None:
        """At start: a pool's last decision (from llm.scaling) younger than `max_age_s` that the actuator
        does not show is applied again (a kill came between its record and its actuation); then pools
        below their minimum (or above their maximum) are brought into bounds."""
        async with self._lock:
            for pool in self.pools.values():
                current = await self.actuator.replicas(pool.name)
                decision = (last or {}).get(pool.name)
                fresh = decision is not None and now_ms() - decision.decided_at_ms <= max_age_s * 1000
                if decision is not None and fresh and decision.desired_replicas != current:
                    desired = pool.spec.bounds.clamp(decision.desired_replicas)
                    log.info("%s: resuming the last decision: %d → %d", pool.name, current, desired)
                    await self.actuator.scale(pool.name, desired)  # already recorded: not published again
                    current = desired
                desired = pool.spec.bounds.clamp(current)
                if desired != current:
                    await self._apply(pool, Decision(current, desired, "pool bounds at start-up", {}))

    async def _apply(
        self, pool: Pool, decision: Decision, release: ReleaseContext | None = None
    ) -> ScaleDecision | None:
        if decision.action == "hold":
            return None
        message = ScaleDecision(
            pool=pool.name,
            current_replicas=decision.current_replicas,
            desired_replicas=decision.desired_replicas,
            reason=decision.reason,
            policy=pool.policy.name,
            action=decision.action,
            signals=decision.signals,
            actuator=self.actuator.name,
            release=release,
        )
        log.info("%s: %d → %d (%s)", pool.name, decision.current_replicas, decision.desired_replicas, decision.reason)
        await self.publish(message)  # recorded first: a restart finishes what it says (`reconcile`)
        await self.actuator.scale(pool.name, decision.desired_replicas)
        return message
