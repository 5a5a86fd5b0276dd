"""The gateway's model catalog on the real broker: a heartbeat that does not decode goes to llm.dlq with
its reason; the catalog goes on with the next one."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaProducer

from llmbus.bus import Bus
from llmbus.bus.tables import read_log
from llmbus.contract import topics as t
from llmbus.contract.messages import DeadLetter, WorkerState, WorkerStatus
from llmbus.settings import BusSettings
from llmbus_services.gateway.adapters.catalog import CatalogFollower, ModelCatalog
from tests.support import eventually

pytestmark = pytest.mark.kafka


async def test_a_bad_heartbeat_is_dead_lettered_and_the_next_one_read(bus_settings: BusSettings) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    workers = topics.name(t.WORKERS)
    producer = AIOKafkaProducer(bootstrap_servers=bus_settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(workers, b'{"worker_id": "w1", "state": "nonsense"}', key=b"w1")
        good = WorkerStatus(worker_id="w2", node_id="n", state=WorkerState.READY, engine="sim", models=["m"])
        await producer.send_and_wait(workers, good.to_bytes(), key=b"w2")
    finally:
        await producer.stop()
    bus = await Bus.start(bus_settings, t.GATEWAY)
    catalog = ModelCatalog(worker_stale_s=3600)
    follower = CatalogFollower(bus_settings, catalog, bus.dead_letter)
    await follower.start()
    try:
        await eventually(lambda: _true(follower.caught_up.is_set()), timeout_s=30)
        assert set(catalog.workers) == {"w2"}
        [(_, letter)] = await read_log(bus_settings, topics.name(t.DLQ), DeadLetter)
        assert letter.source_topic == workers and letter.service == t.GATEWAY
        assert letter.error_code == "invalid_request" and "state" in letter.error
    finally:
        await follower.stop()
        await bus.stop()


async def _true(value: bool) -> bool:
    return value
