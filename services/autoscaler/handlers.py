"""Autoscaler handlers (thin): heartbeats → the fleet table; pool statistics → policy → actuator.

Each scheduler instance sends one PoolStats per pool every few seconds; the merger combines
the instances' statistics of a pool (policy/merge.py) and each merged PoolStats is one
evaluation of the pool's policy. A change is applied through the actuator and published as a ScaleDecision on
llm.scaling with the policy, the signal values and the reason; so are the start-up moves
that bring a pool to its minimum.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llmbus.messages import PoolStats, ScaleDecision, WorkerStatus, now_ms
from services.autoscaler.actuators import Actuator
from services.autoscaler.policy import Decision, FleetTable, ScalingPolicy
from services.autoscaler.policy.config import PoolsFile, PoolSpec
from services.autoscaler.policy.merge import PoolStatsMerger

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
            return await self._apply(pool, decision)

    async def reconcile(self) -> None:
        """At start: pools below their minimum (or above their maximum) are brought into bounds."""
        async with self._lock:
            for pool in self.pools.values():
                current = await self.actuator.replicas(pool.name)
                desired = pool.spec.bounds.clamp(current)
                if desired != current:
                    await self._apply(pool, Decision(current, desired, "pool bounds at start-up", {}))

    async def _apply(self, pool: Pool, decision: Decision) -> ScaleDecision | None:
        if decision.action == "hold":
            return None
        await self.actuator.scale(pool.name, decision.desired_replicas)
        message = ScaleDecision(
            pool=pool.name,
            current_replicas=decision.current_replicas,
            desired_replicas=decision.desired_replicas,
            reason=decision.reason,
            policy=pool.policy.name,
            action=decision.action,
            signals=decision.signals,
            actuator=self.actuator.name,
        )
        log.info("%s: %d → %d (%s)", pool.name, decision.current_replicas, decision.desired_replicas, decision.reason)
        await self.publish(message)
        return message
