"""The autoscaler's wiring in memory (llmbus.bus.memory): statistics in, a ScaleDecision out."""

from __future__ import annotations

from llmbus.bus.codec import decode
from llmbus.bus.memory import MemoryBus
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import DeadLetter, PoolStats, ScaleDecision, WorkerState, WorkerStatus, now_ms
from llmbus.settings import BusSettings
from llmbus_services.autoscaler.adapters.actuators import NoActuator
from llmbus_services.autoscaler.app import build_app
from llmbus_services.autoscaler.config import AutoscalerSettings


async def test_pool_at_zero_wakes_on_a_waiting_request_and_the_decision_is_published() -> None:
    bus = MemoryBus(BusSettings(topic_prefix="unit."))
    runtime = bus.runtime(contracts.AUTOSCALER)
    actuator = NoActuator()
    handlers = build_app(runtime, AutoscalerSettings(actuator="none"), actuator)
    topics = bus.topics
    now = now_ms()
    await bus.send(
        topics.name(t.WORKERS),
        WorkerStatus(
            worker_id="w1",
            node_id="n",
            state=WorkerState.STOPPED,  # gone: the pool is at zero; its measurements stay
            engine="sim",
            models=["sim-llama-8b"],
            cold_start_s=4.5,
            max_num_seqs=16,
        ),
    )
    stats = PoolStats(
        pool="sim-llama-8b", window_start_ms=now - 5000, window_s=5.0, arrivals=1, queued=1, oldest_wait_ms=900
    )
    await bus.send(topics.name(t.POOL_STATS), stats)
    await bus.send(topics.name(t.POOL_STATS), stats.model_copy(update={"pool": "not-managed"}))

    assert await actuator.replicas("sim-llama-8b") == 1
    (decision,) = bus.published(topics.name(t.SCALING), ScaleDecision)
    assert decision.pool == "sim-llama-8b" and decision.policy == "threshold" and decision.action == "up"
    assert decision.current_replicas == 0 and decision.desired_replicas == 1
    assert decision.signals["queued"] == 1 and decision.signals["cold_start_s"] == 4.5
    assert decision.actuator == "none"
    assert handlers.fleet.slots["sim-llama-8b"] == 16
    assert not runtime.contract.undeclared(topics, runtime.publisher.topics_written)


async def test_a_bad_heartbeat_goes_to_the_dlq_with_its_reason_and_the_next_one_is_read() -> None:
    bus = MemoryBus(BusSettings(topic_prefix="unit."))
    runtime = bus.runtime(contracts.AUTOSCALER)
    handlers = build_app(runtime, AutoscalerSettings(actuator="none"), NoActuator())
    workers = bus.topics.name(t.WORKERS)
    await bus.send(workers, b'{"worker_id": "w1", "state": "nonsense"}', key="w1")
    status = WorkerStatus(
        worker_id="w2", node_id="n", state=WorkerState.READY, engine="sim", models=["sim-llama-8b"], max_num_seqs=8
    )
    await bus.send(workers, status, key="w2")
    (letter,) = [decode(r, DeadLetter) for r in bus.log.records if r.topic == bus.topics.name(t.DLQ)]
    assert letter.source_topic == workers and letter.error_code == "invalid_request" and "state" in letter.error
    assert letter.service == t.AUTOSCALER
    assert handlers.fleet.slots["sim-llama-8b"] == 8
    assert not runtime.contract.undeclared(bus.topics, runtime.publisher.topics_written)


async def test_statistics_replayed_from_an_hour_ago_are_not_acted_on() -> None:
    bus = MemoryBus(BusSettings(topic_prefix="unit."))
    runtime = bus.runtime(contracts.AUTOSCALER)
    actuator = NoActuator()
    build_app(runtime, AutoscalerSettings(actuator="none"), actuator)
    topics = bus.topics
    hour_ago = now_ms() - 3600 * 1000
    waiting = PoolStats(
        pool="sim-llama-8b",
        window_start_ms=hour_ago - 5000,
        window_s=5.0,
        arrivals=1,
        queued=1,
        oldest_wait_ms=900,
        sent_at_ms=hour_ago,
    )
    await bus.send(topics.name(t.POOL_STATS), waiting)
    assert bus.published(topics.name(t.SCALING), ScaleDecision) == []
    assert await actuator.replicas("sim-llama-8b") == 0
    # The same queue reported now wakes the pool: only the age kept it asleep.
    fresh = waiting.model_copy(update={"sent_at_ms": now_ms(), "window_start_ms": now_ms() - 5000})
    await bus.send(topics.name(t.POOL_STATS), fresh)
    assert [d.action for d in bus.published(topics.name(t.SCALING), ScaleDecision)] == ["up"]


class DiesOnScale(NoActuator):
    """An actuator whose process is killed as it acts: the decision must already be on record."""

    async def scale(self, pool: str, replicas: int) -> None:
        raise SystemExit("killed mid-actuation")


def _waiting(pool: str = "sim-llama-8b") -> PoolStats:
    now = now_ms()
    return PoolStats(pool=pool, window_start_ms=now - 5000, window_s=5.0, arrivals=1, queued=1, oldest_wait_ms=900)


async def test_a_decision_is_recorded_before_it_is_applied_and_a_restart_finishes_applying_it() -> None:
    bus = MemoryBus(BusSettings(topic_prefix="unit."))
    scaling = bus.topics.name(t.SCALING)
    runtime = bus.runtime(contracts.AUTOSCALER)
    build_app(runtime, AutoscalerSettings(actuator="none"), DiesOnScale())
    try:
        await bus.send(bus.topics.name(t.POOL_STATS), _waiting())
    except SystemExit:
        pass
    (recorded,) = bus.published(scaling, ScaleDecision)
    assert (recorded.current_replicas, recorded.desired_replicas) == (0, 1)

    # The restarted autoscaler: its actuator shows 0, its log says 1 → applied, and not recorded again.
    restarted = MemoryBus(BusSettings(topic_prefix="unit."))
    actuator = NoActuator()
    handlers = build_app(restarted.runtime(contracts.AUTOSCALER), AutoscalerSettings(actuator="none"), actuator)
    await handlers.reconcile({"sim-llama-8b": recorded})
    assert await actuator.replicas("sim-llama-8b") == 1
    assert restarted.published(restarted.topics.name(t.SCALING), ScaleDecision) == []


async def test_a_stale_last_decision_is_history_not_an_order() -> None:
    bus = MemoryBus(BusSettings(topic_prefix="unit."))
    actuator = NoActuator()
    handlers = build_app(bus.runtime(contracts.AUTOSCALER), AutoscalerSettings(actuator="none"), actuator)
    old = ScaleDecision(
        pool="sim-llama-8b",
        current_replicas=1,
        desired_replicas=3,
        reason="yesterday's peak",
        policy="threshold",
        action="up",
        decided_at_ms=now_ms() - 3_600_000,
    )
    await handlers.reconcile({"sim-llama-8b": old}, max_age_s=600)
    assert await actuator.replicas("sim-llama-8b") == 0
