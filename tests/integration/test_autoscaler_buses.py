"""The autoscaler's own wiring (app.build_app) in memory and on the real broker: its last decision per pool read
back at start and finished; a waiting request waking a pool at zero, the decision recorded, then applied."""

from __future__ import annotations

from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import PoolStats, ScaleDecision, WorkerState, WorkerStatus, now_ms
from llmbus_services.autoscaler.adapters.actuators import NoActuator
from llmbus_services.autoscaler.app import build_app
from llmbus_services.autoscaler.config import AutoscalerSettings
from tests.fixtures.buses import EitherBus
from tests.support import until

POOL = "sim-llama-8b"


async def test_a_restart_finishes_its_last_decision_and_a_waiting_request_wakes_the_pool(on_bus: EitherBus) -> None:
    topics = on_bus.topics
    scaling = topics.name(t.SCALING)
    recorded = ScaleDecision(  # recorded by a run killed before it applied it
        pool=POOL, current_replicas=0, desired_replicas=1, reason="queued", policy="threshold", action="up"
    )
    await on_bus.send(scaling, recorded, key=POOL)
    runtime = await on_bus.runtime(contracts.AUTOSCALER)
    actuator = NoActuator()
    handlers = build_app(runtime, AutoscalerSettings(actuator="none"), actuator)
    await on_bus.start(runtime)  # the start-up read of llm.scaling applies it, without recording it again
    assert await actuator.replicas(POOL) == 1

    await actuator.scale(POOL, 0)  # its worker went away: the pool is at zero again
    stopped = WorkerStatus(
        worker_id="w1", node_id="n", state=WorkerState.STOPPED, engine="sim", models=[POOL], max_num_seqs=16
    )
    await on_bus.send(topics.name(t.WORKERS), stopped, key="w1")
    await until(lambda: handlers.fleet.slots.get(POOL) == 16, timeout_s=30)
    now = now_ms()
    waiting = PoolStats(pool=POOL, window_start_ms=now - 5000, window_s=5.0, arrivals=1, queued=1, oldest_wait_ms=900)
    await on_bus.send(topics.name(t.POOL_STATS), waiting, key=POOL)
    decisions = await on_bus.published(scaling, ScaleDecision, until=lambda found: len(found) >= 2)
    assert len(decisions) == 2 and decisions[1].action == "up" and decisions[1].current_replicas == 0
    await until(lambda: actuator._replicas.get(POOL) == 1, timeout_s=30)
    assert not runtime.contract.undeclared(topics, runtime.publisher.topics_written)
