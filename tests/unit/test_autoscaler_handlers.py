"""The autoscaler's FastStream app in memory (TestKafkaBroker): statistics in, a ScaleDecision out."""

from __future__ import annotations

from faststream.kafka import TestKafkaBroker

from llmbus import topics as t
from llmbus.messages import PoolStats, ScaleDecision, WorkerState, WorkerStatus, now_ms
from llmbus.settings import BusSettings
from services.autoscaler.actuators import NoActuator
from services.autoscaler.app import build_app
from services.autoscaler.config import AutoscalerSettings


async def test_pool_at_zero_wakes_on_a_waiting_request_and_the_decision_is_published() -> None:
    settings = BusSettings(topic_prefix="unit.")
    actuator = NoActuator()
    _, broker, handlers = build_app(settings, AutoscalerSettings(actuator="none"), actuator)
    topics = t.Topics(settings.topic_prefix)
    decisions: list[ScaleDecision] = []

    @broker.subscriber(topics.name(t.SCALING))
    async def seen(decision: ScaleDecision) -> None:
        decisions.append(decision)

    async with TestKafkaBroker(broker):
        now = now_ms()
        await broker.publish(
            WorkerStatus(
                worker_id="w1",
                node_id="n",
                state=WorkerState.STOPPED,  # gone: the pool is at zero; its measurements stay
                engine="sim",
                models=["sim-llama-8b"],
                cold_start_s=4.5,
                max_num_seqs=16,
            ).model_dump(mode="json"),
            topics.name(t.WORKERS),
        )
        stats = PoolStats(
            pool="sim-llama-8b", window_start_ms=now - 5000, window_s=5.0, arrivals=1, queued=1, oldest_wait_ms=900
        )
        await broker.publish(stats.model_dump(mode="json"), topics.name(t.POOL_STATS))
        await broker.publish(
            stats.model_copy(update={"pool": "not-managed"}).model_dump(mode="json"), topics.name(t.POOL_STATS)
        )

    assert await actuator.replicas("sim-llama-8b") == 1
    (decision,) = decisions
    assert decision.pool == "sim-llama-8b" and decision.policy == "threshold" and decision.action == "up"
    assert decision.current_replicas == 0 and decision.desired_replicas == 1
    assert decision.signals["queued"] == 1 and decision.signals["cold_start_s"] == 4.5
    assert decision.actuator == "none"
    assert handlers.fleet.slots["sim-llama-8b"] == 16


async def test_a_heartbeat_from_a_newer_worker_with_an_unknown_field_is_still_read() -> None:
    settings = BusSettings(topic_prefix="unit.")
    _, broker, handlers = build_app(settings, AutoscalerSettings(actuator="none"), NoActuator())
    status = WorkerStatus(
        worker_id="w1", node_id="n", state=WorkerState.READY, engine="sim", models=["sim-llama-8b"], max_num_seqs=8
    ).model_dump(mode="json")
    async with TestKafkaBroker(broker):
        await broker.publish(status | {"npu_temperature_c": 41.0}, t.Topics(settings.topic_prefix).name(t.WORKERS))
    assert handlers.fleet.slots["sim-llama-8b"] == 8
