"""A Redis that refuses writes for a while (out of memory, read-only after a failover) costs no record.

cost-accounting (the real runtime on the broker, its Redis a private instance) bills a batch of
hosted results while that Redis answers OOM (maxmemory reached with noeviction), then READONLY (made a
replica of a primary that is not there): every write of the batch fails. Pass criteria, fixed before
the run: while Redis refuses, nothing reaches llm.dlq and nothing is billed (the batch waits,
uncommitted, retried in place); the runtime reports the retry (`llmbus_handler_retries_total`) and,
past its watchdog's time, that it is not live; once Redis takes writes again every result is billed
exactly once and the service is live again.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
import redis.asyncio as redis
from prometheus_client import REGISTRY

from llmbus.bus import Bus
from llmbus.bus.admin import ensure_catalog
from llmbus.bus.tables import read_log
from llmbus.contract import topics as t
from llmbus.contract.messages import CostRecord, DeadLetter
from llmbus.settings import BusSettings
from llmbus_services.cost_accounting.app import CostService
from llmbus_services.cost_accounting.config import CostSettings
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.reliability.infra import PrivateRedis
from llmbus_tools.harness.service_procs import drop_namespace, fresh_settings
from tests.integration.test_cost_handlers import hosted
from tests.support import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


async def refuse_writes(client: redis.Redis, how: str) -> None:
    if how == "oom":
        await client.config_set("maxmemory-policy", "noeviction")
        await client.config_set("maxmemory", "1")  # every write that needs memory: OOM
    else:  # a replica of a primary that is not there: it keeps its data and refuses every write
        await client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))


async def take_writes(client: redis.Redis) -> None:
    await client.config_set("maxmemory", "0")
    await client.execute_command("REPLICAOF", "NO", "ONE")


def retries() -> float:
    """cost-accounting's handler calls retried in place so far (llmbus_handler_retries_total)."""
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        for sample in metric.samples
        if sample.name == "llmbus_handler_retries_total" and sample.labels.get("service") == t.COST
    )


async def costs_of(settings: BusSettings) -> Counter[str]:
    records = await read_log(settings, t.Topics(settings.topic_prefix).name(t.COSTS), CostRecord)
    return Counter(record.record_id for _, record in records)


@pytest.mark.parametrize("how", ["oom", "readonly"])
async def test_a_batch_meeting_a_redis_that_refuses_writes_waits_and_is_billed_once(
    how: str, tmp_path: Path, kafka_up: None
) -> None:
    private = PrivateRedis(tmp_path / "redis")
    await asyncio.to_thread(private.start)
    base = fresh_settings(redis_url=private.url, commit_interval_s=0.1)
    settings = base.model_copy(update={"watchdog_s": 2.0})  # not live after 2 s of retries
    client = redis.Redis.from_url(private.url)
    service = CostService(settings, CostSettings(interval_s=60, grace_s=1, settle_s=0))
    topics = t.Topics(settings.topic_prefix)
    try:
        await ensure_catalog(settings)
        await service.start()
        await refuse_writes(client, how)
        bus = await Bus.start(settings, t.CLIENT, client_suffix="-results")
        try:
            for i in range(20):
                result = hosted(f"r{i}")
                await bus.publisher.publish(topics.name(t.RESULTS), result, key=result.request_id)
        finally:
            await bus.stop()

        retries_before = retries()

        async def retried_or_dead_lettered() -> bool:
            return retries() > retries_before + 3 or bool(await read_log(settings, topics.name(t.DLQ), DeadLetter))

        await eventually(retried_or_dead_lettered, timeout_s=60, interval_s=0.2)
        assert await read_log(settings, topics.name(t.DLQ), DeadLetter) == []  # nothing dead-lettered
        assert await costs_of(settings) == Counter()  # nor billed while Redis refuses

        async def retried_past_the_watchdog() -> bool:
            return not service.runtime.live

        await eventually(retried_past_the_watchdog, timeout_s=60, interval_s=0.2)
        assert not service.runtime.live

        await take_writes(client)
        wanted = {f"acme:r{i}" for i in range(20)}

        async def all_billed() -> bool:
            return set(await costs_of(settings)) >= wanted

        await eventually(all_billed, timeout_s=60, interval_s=0.5)
        await asyncio.sleep(1)
        assert await costs_of(settings) == Counter(dict.fromkeys(wanted, 1))
        assert await read_log(settings, topics.name(t.DLQ), DeadLetter) == []
        assert service.runtime.live
    finally:
        await service.stop()
        await client.aclose()
        await asyncio.to_thread(private.stop)
        await drop_namespace(settings)
