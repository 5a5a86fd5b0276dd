"""Two scheduler instances' PoolStats on the real llm.pool-stats topic: the autoscaler app merges them.

The app (the bus runtime, real broker, no actuator) reads what two instances publish for one pool, and
the policy is evaluated on the pool as a whole: its ScaleDecision on llm.scaling carries the sum of
both instances' queues and says that two instances were merged.
"""

from __future__ import annotations

import pytest

from llmbus.bus import Bus
from llmbus.bus.service import ServiceRuntime
from llmbus.bus.tables import read_log
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import PoolStats, ScaleDecision, now_ms
from llmbus.settings import BusSettings
from llmbus_services.autoscaler.adapters.actuators import NoActuator
from llmbus_services.autoscaler.app import build_app
from llmbus_services.autoscaler.config import AutoscalerSettings
from tests.support import eventually

pytestmark = [pytest.mark.kafka]

POOL = "sim-llama-8b"  # a pool of the default pools file (threshold, minimum 0)


async def test_two_instances_stats_are_merged_into_one_evaluation(bus_settings: BusSettings) -> None:
    s = bus_settings
    topics = t.Topics(s.topic_prefix)
    actuator = NoActuator()
    runtime = await ServiceRuntime.connect(s, contracts.AUTOSCALER)
    handlers = build_app(runtime, AutoscalerSettings(actuator="none", stats_max_wait_s=60), actuator)
    scheduler = await Bus.start(s, t.SCHEDULER)  # the statistics' writer
    try:
        # The statistics subscription starts at the latest offset of its group: start() returns once it is assigned.
        await runtime.start()
        start = now_ms()

        async def report(instance: str, at_ms: int, queued: int) -> None:
            stats = PoolStats(
                pool=POOL,
                instance_id=instance,
                window_start_ms=at_ms - 5000,
                window_s=5.0,
                arrivals=queued,
                queued=queued,
                oldest_wait_ms=400.0 if queued else 0.0,
                sent_at_ms=at_ms,
            )
            await scheduler.publisher.publish(topics.name(t.POOL_STATS), stats, key=POOL)

        # Idle: a alone is evaluated at once (hold); b joins; a's next report completes the round (hold).
        await report("sched-a", start, 0)
        await report("sched-b", start + 100, 0)
        await report("sched-a", start + 5000, 0)
        # Then b has 3 waiting and a 2: one evaluation, once both have reported, on the sum.
        await report("sched-b", start + 5100, 3)
        await report("sched-a", start + 10_000, 2)
        log: list[tuple[str, ScaleDecision]] = []

        async def decided() -> bool:
            log[:] = await read_log(s, topics.name(t.SCALING), ScaleDecision)
            return bool(log)

        await eventually(decided, timeout_s=60, interval_s=0.5)
        [(key, decision)] = log
        assert key == POOL and decision.action == "up" and decision.desired_replicas == 1
        assert decision.signals["queued"] == 5 and decision.signals["scheduler_instances"] == 2
        assert decision.signals["arrival_rate_per_s"] == 1.0  # (2 + 3) arrivals over the 5 s window
        assert handlers.merger.instances(POOL) == ["sched-a", "sched-b"]
        assert await actuator.replicas(POOL) == 1
        assert not runtime.contract.undeclared(topics, runtime.publisher.topics_written)
    finally:
        await runtime.stop()
        await scheduler.stop()
