"""Two scheduler instances in one consumer group split the models and never place a request twice."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as redis

from llmbus.settings import BusSettings
from llmbus_services.scheduler.adapters.store import PlacementStore
from llmbus_tools.harness.service_procs import ServiceProc
from tests.integration.test_scheduler_recovery import scheduler_setup, send_routed
from tests.support import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.redis]
MODELS = [f"model-{i}" for i in range(8)]


async def test_two_instances_split_models_without_double_placement(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    async with scheduler_setup(bus_settings, services, {}, instances=2) as (bus, fleet, _results):
        await fleet.add("w1", models=MODELS)
        await fleet.add("w2", models=MODELS)
        fleet.start()
        # Both instances join the group and share llm.routed's partitions (a fixed sleep was too
        # short on a loaded machine: the second one's join came after the requests were placed).
        schedulers = [proc for proc in services if proc.module == "llmbus_services.scheduler"]

        async def both_hold_routed_partitions() -> bool:
            return len(schedulers) == 2 and all(
                "llm.routed[" in proc.log_path.read_text(errors="replace") for proc in schedulers
            )

        await eventually(both_hold_routed_partitions, timeout_s=90)
        ids: list[str] = []
        for model in MODELS:
            ids += await send_routed(bus, 5, model=model)
        got = await fleet.dispatches(len(ids), timeout_s=60)
        got += await fleet.dispatches(1, timeout_s=2)  # a double placement would show up here
        placed = [d.request_id for d in got]
        assert sorted(placed) == sorted(ids), "every request placed exactly once"
        assert all(d.attempt == 1 for d in got)
        # Who placed what: each placement's claim in Redis names its instance.
        client = redis.Redis.from_url(bus_settings.redis_url)
        store = PlacementStore(client, f"{bus_settings.topic_prefix}scheduler", "reader")
        raw = [value async for value in store.raw_values()]
        await client.aclose()
        by_model: dict[str, set[str]] = {}
        for value in raw:
            data = json.loads(value)
            by_model.setdefault(data["model"], set()).add(data["instance"])
        assert len(raw) == len(ids)
        assert all(len(instances) == 1 for instances in by_model.values()), "one instance owns a model"
        assert len(set().union(*by_model.values())) == 2, "both instances placed some models"
