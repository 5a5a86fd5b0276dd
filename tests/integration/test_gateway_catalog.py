"""The gateway's model catalog (app.follow_catalog) in memory and on the real broker: llm.models and llm.workers
followed and caught up before the gateway serves; a heartbeat that does not decode goes to llm.dlq with its
reason, and the catalog goes on with the next one."""

from __future__ import annotations

import pytest

from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import DeadLetter, ModelSpec, WorkerState, WorkerStatus
from llmbus_services.gateway.app import follow_catalog
from llmbus_services.gateway.config import GatewaySettings
from tests.fixtures.buses import EitherBus

pytestmark = pytest.mark.redis


async def test_the_catalog_is_caught_up_before_serving_and_a_bad_heartbeat_is_dead_lettered(
    on_bus: EitherBus,
) -> None:
    topics = on_bus.topics
    workers = topics.name(t.WORKERS)
    runtime = await on_bus.runtime(contracts.GATEWAY)
    catalog = follow_catalog(runtime, GatewaySettings(worker_stale_s=3600))
    await on_bus.send(workers, b'{"worker_id": "w1", "state": "nonsense"}', key="w1")
    good = WorkerStatus(worker_id="w2", node_id="n", state=WorkerState.READY, engine="sim", models=["m"])
    await on_bus.send(workers, good, key="w2")
    await on_bus.send(topics.name(t.MODELS), ModelSpec(name="declared", tier="small"), key="declared")
    await on_bus.start(runtime)  # returns once the followed state is caught up
    assert runtime.caught_up.is_set() and set(catalog.workers) == {"w2"} and set(catalog.specs) == {"declared"}
    assert [entry["id"] for entry in catalog.listing()] == ["declared", "m"]
    [letter] = await on_bus.published(topics.name(t.DLQ), DeadLetter, until=lambda found: len(found) >= 1)
    assert letter.source_topic == workers and letter.service == t.GATEWAY
    assert letter.error_code == "invalid_request" and "state" in letter.error
