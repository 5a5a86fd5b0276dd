"""A crash in the middle of a batch bills nothing twice (real broker, real Redis, a real SIGKILL).

The service takes llm.results in batches and bills each batch in three steps: its CostRecords into
the outbox (Redis), onto llm.costs, then into the aggregates in one script (every record's marker,
the results' seen markers, the summed increments, the outbox cleared). Killed after each step, it
comes back, bills the outbox first and reads the batch again. Every result must count exactly once
in the aggregates, and llm.costs must hold every record, each copy of a record id the same.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from llmbus.bus import Bus, decode
from llmbus.bus.admin import open_admin
from llmbus.bus.catch_up import read_to_end
from llmbus.contract import topics as t
from llmbus.contract.messages import CostRecord, InferenceResult, ResultStatus, Usage, now_ms
from llmbus.settings import BusSettings
from llmbus.state.keys import cost_key_root
from llmbus.state.store import redis_client
from llmbus.state.text import text_of
from llmbus_services.cost_accounting.core.aggregates import agg_key, read_totals
from llmbus_services.cost_accounting.core.prices import load_pricebook
from llmbus_tools.harness.service_procs import ServiceProc
from tests.support import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.redis]
BOOK = load_pricebook()
RESULTS = 1_200
BATCH = 500  # records per batch of the crashing run: the crash comes with more batches to follow


async def offsets(settings: BusSettings, topic: str, group: str | None) -> dict[int, int]:
    """End offsets of `topic` (group None), or what `group` has committed on it."""
    if group is not None:
        async with open_admin(settings) as admin:
            committed = await asyncio.wait_for(admin.list_consumer_group_offsets(group), 30)
        return {tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic}
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    try:
        await asyncio.wait_for(consumer.start(), 30)
        parts = [
            TopicPartition(topic, p) for p in range(t.BY_NAME[topic.removeprefix(settings.topic_prefix)].partitions)
        ]
        ends = await asyncio.wait_for(consumer.end_offsets(parts), 30)
    finally:
        await asyncio.wait_for(consumer.stop(), 30)
    return {tp.partition: end for tp, end in ends.items()}


async def cost_log(settings: BusSettings, topic: str) -> list[CostRecord]:
    ends = await offsets(settings, topic, None)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    out: list[CostRecord] = []
    try:
        await asyncio.wait_for(consumer.start(), 30)
        parts = {TopicPartition(topic, p): end for p, end in ends.items() if end > 0}
        consumer.assign(list(parts))
        async for record in read_to_end(consumer, parts, 60, call_timeout_s=30):
            out.append(decode(record, CostRecord))  # type: ignore[arg-type]
    finally:
        await asyncio.wait_for(consumer.stop(), 30)
    return out


@pytest.mark.parametrize("crash_at", ["staged", "published", "applied"])
async def test_crash_mid_batch_bills_each_result_once(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path, crash_at: str
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    at_ms = now_ms()
    backlog = [
        InferenceResult(
            request_id=f"crash-{i}",
            tenant=f"tenant-{i % 7}",
            status=ResultStatus.OK,
            model="gpt-4.1" if i % 3 else "gpt-4.1-mini",
            usage=Usage(prompt_tokens=100 + i, cached_prompt_tokens=i % 50, completion_tokens=10 + i % 90),
            completed_at_ms=at_ms,
        )
        for i in range(RESULTS)
    ]
    expected_micro = sum(
        BOOK.hosted[r.model or ""].cost_micro(
            r.usage.prompt_tokens, r.usage.cached_prompt_tokens, r.usage.completion_tokens
        )
        for r in backlog
    )
    bus = await Bus.start(bus_settings, t.CLIENT)
    redis = redis_client(bus_settings.redis_url)
    try:
        for r in backlog:
            await bus.publisher.publish(topics.name(t.RESULTS), r, key=r.request_id, wait=False)
        await asyncio.wait_for(bus.producer.flush(), 60)

        # tenant-0 has a budget: billing the outbox at start-up announces its state on llm.budgets
        budgets = tmp_path / "budgets.yaml"
        budgets.write_text("tenants:\n  tenant-0: {limit_usd: 1000, period: month}\n")
        env = {"LLMBUS_COST_BUDGETS_PATH": str(budgets)}
        flag = tmp_path / "stopped"
        crashing = ServiceProc(
            "tests.integration.cost_crash_service",
            bus_settings,
            name="cost-crashing",
            log_dir=tmp_path,
            env=env
            | {
                "LLMBUS_TEST_CRASH_AT": crash_at,
                "LLMBUS_TEST_CRASH_FLAG": str(flag),
                "LLMBUS_COST_BATCH_MAX_RECORDS": str(BATCH),
            },
        ).start()
        services.append(crashing)

        async def stopped_there() -> bool:
            return flag.exists()

        await eventually(stopped_there, timeout_s=90, interval_s=0.2)
        crashing.kill()  # SIGKILL mid-batch: no commit, no cleanup

        group = topics.group(t.COST, "results")
        results_topic, costs_topic = topics.name(t.RESULTS), topics.name(t.COSTS)
        outbox = f"{cost_key_root(bus_settings.topic_prefix)}outbox"
        # the scenario really happened: staged records wait in the outbox, or applied ones are in the
        # aggregates that Kafka was never told are done
        if crash_at in ("staged", "published"):
            assert await redis.hlen(outbox) > 0
        else:
            applied = [
                k
                async for k in redis.scan_iter(match=f"{cost_key_root(bus_settings.topic_prefix)}applied:*", count=1000)
            ]
            committed = sum((await offsets(bus_settings, results_topic, group)).values())
            assert len(applied) > committed

        services.append(ServiceProc("llmbus_services.cost_accounting", bus_settings, env=env, log_dir=tmp_path).start())
        day_total = agg_key(bus_settings.topic_prefix, "day", at_ms, "total")

        async def all_applied() -> bool:
            ends, done = (
                await offsets(bus_settings, results_topic, None),
                await offsets(bus_settings, results_topic, group),
            )
            if any(done.get(p, 0) < end for p, end in ends.items()):
                return False
            totals = read_totals({text_of(k): int(v) for k, v in (await redis.hgetall(day_total)).items()})
            return totals.get("all", {}).get("requests", 0) >= RESULTS

        await eventually(all_applied, timeout_s=120, interval_s=0.5)
        totals = read_totals({text_of(k): int(v) for k, v in (await redis.hgetall(day_total)).items()})["all"]
        assert totals["requests"] == RESULTS
        assert totals["cost"] == expected_micro
        logged = await cost_log(bus_settings, costs_topic)
        assert {c.record_id for c in logged} == {r.request_key for r in backlog}
        copies: dict[str, bytes] = {}
        for c in logged:  # a record published twice is the same record twice
            assert copies.setdefault(c.record_id, c.to_bytes()) == c.to_bytes()
        if crash_at == "published":
            assert len(logged) > RESULTS  # a batch was published twice, and still counted once
        else:
            assert len(logged) == RESULTS
        assert await redis.hlen(outbox) == 0
    finally:
        async for key in redis.scan_iter(match=f"{bus_settings.topic_prefix}*", count=1000):
            await redis.delete(key)
        await redis.aclose()
        await bus.stop()
