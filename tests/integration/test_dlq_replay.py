"""`llmbus dlq replay` puts dead-lettered results back on llm.results, and replaying twice bills nothing twice.

The namespace is left as cost-accounting left it when it dead-lettered a batch on a Redis error: ten
results on llm.results, a dead letter for each (service cost-accounting), its group committed past
them. A dead letter of another service (the router's, of a request) sits beside them. Pass criteria,
fixed before the run: `llmbus dlq replay --source cost-accounting --since 1h --topic llm.results`
replays exactly the ten (their copies carry `llmbus-replayed-from`), cost-accounting bills each once;
a second replay puts ten more copies on llm.results, cost-accounting reads them (its group reaches the
end of the topic) and bills none again: one record per result on llm.costs, Redis totals unchanged,
because each result's seen marker (cost:seen:<tenant>:<request id>) was set with its first bill.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from typer.testing import CliRunner

from llmbus.bus import Bus, make_consumer, stop_consumer
from llmbus.bus.admin import ensure_catalog
from llmbus.bus.catch_up import read_to_end
from llmbus.bus.dlq import send_to_dlq
from llmbus.bus.dlq_replay import REPLAYED_FROM
from llmbus.bus.tables import partitions_of, read_log, reader
from llmbus.cli.main import app
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import CostRecord, ErrorCode, InferenceRequest
from llmbus.settings import BusSettings
from llmbus_services.cost_accounting.app import CostService
from llmbus_services.cost_accounting.config import CostSettings
from llmbus_tools.harness.reliability.effects import Billing
from llmbus_tools.harness.service_procs import drop_namespace, fresh_settings
from tests.integration.test_cost_handlers import hosted
from tests.support import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.redis]
IDS = [f"r{i}" for i in range(10)]


async def raw_records(settings: BusSettings, topic: str) -> list[ConsumerRecord]:
    consumer = reader(settings)
    await consumer.start()
    try:
        tps = await partitions_of(settings, [topic])
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        return [record async for record in read_to_end(consumer, ends, 30, call_timeout_s=10)]
    finally:
        await consumer.stop()


async def commit_at_end(settings: BusSettings, group: str, topic: str) -> dict[TopicPartition, int]:
    """The group's offsets moved to the topic's end, as a consumer that dead-lettered what it read leaves them."""
    consumer = make_consumer(settings, group_id=group, client_id="dlq-test")
    await consumer.start()
    try:
        tps = await partitions_of(settings, [topic])
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.commit(dict(ends))
        return dict(ends)
    finally:
        await stop_consumer(consumer, 10)


async def group_at_end(settings: BusSettings, group: str, topic: str) -> bool:
    consumer = make_consumer(settings, group_id=group, client_id="dlq-test-look")
    await consumer.start()
    try:
        tps = await partitions_of(settings, [topic])
        ends = await consumer.end_offsets(tps)
        committed = {tp: await consumer.committed(tp) or 0 for tp in ends}
        return all(committed[tp] >= end for tp, end in ends.items())
    finally:
        await stop_consumer(consumer, 10)


def replay(settings: BusSettings) -> str:
    args = ["dlq", "replay", "--source", t.COST, "--since", "1h", "--topic", t.RESULTS]
    outcome = CliRunner().invoke(app, args, env={"LLMBUS_TOPIC_PREFIX": settings.topic_prefix})
    assert outcome.exit_code == 0, outcome.output
    return outcome.output


async def test_replaying_a_services_dead_letters_twice_bills_each_result_once(kafka_up: None, redis_up: None) -> None:
    settings = fresh_settings(commit_interval_s=0.1)
    topics = t.Topics(settings.topic_prefix)
    results_topic = topics.name(t.RESULTS)
    group = contracts.COST.group_id("results", topics)
    assert group is not None
    service = CostService(settings, CostSettings(interval_s=60, grace_s=1, settle_s=0))
    try:
        await ensure_catalog(settings)
        bus = await Bus.start(settings, t.CLIENT, client_suffix="-dlq")
        try:
            for request_id in IDS:
                await bus.publisher.publish(results_topic, hosted(request_id), key=request_id)
            request = InferenceRequest(request_id="q1", prompt="hi")
            await bus.publisher.publish(topics.name(t.REQUESTS), request, key="q1")
            for record in await raw_records(settings, results_topic):
                await send_to_dlq(bus.publisher, topics, record, ErrorCode.INTERNAL, "OutOfMemoryError: OOM", t.COST)
            [request_record] = await raw_records(settings, topics.name(t.REQUESTS))
            await send_to_dlq(bus.publisher, topics, request_record, ErrorCode.INTERNAL, "other", t.ROUTER)
        finally:
            await bus.stop()
        await commit_at_end(settings, group, results_topic)
        await service.start()

        output = await asyncio.to_thread(replay, settings)
        assert "10 replayed" in output, output
        wanted = {f"acme:{request_id}" for request_id in IDS}

        async def costs() -> Counter[str]:
            return Counter(r.record_id for _, r in await read_log(settings, topics.name(t.COSTS), CostRecord))

        async def all_billed() -> bool:
            return set(await costs()) >= wanted

        await eventually(all_billed, timeout_s=60, interval_s=0.5)
        copies = [r for r in await raw_records(settings, results_topic) if dict(r.headers).get(REPLAYED_FROM)]
        assert len(copies) == 10
        totals_after_first = await Billing(settings).redis_tenant_totals()
        assert totals_after_first["acme"][1] == 10  # (µUSD, requests) in the totals reports and budgets read
        seen = await service.store.seen([hosted(request_id) for request_id in IDS])
        assert all(seen)  # the markers that make the second replay a no-op

        output = await asyncio.to_thread(replay, settings)
        assert "10 replayed" in output, output

        async def read_again() -> bool:
            return await group_at_end(settings, group, results_topic)

        await eventually(read_again, timeout_s=60, interval_s=0.5)  # the second copies were handled
        assert len([r for r in await raw_records(settings, results_topic) if dict(r.headers).get(REPLAYED_FROM)]) == 20
        assert await costs() == Counter(dict.fromkeys(wanted, 1))
        assert await Billing(settings).redis_tenant_totals() == totals_after_first
    finally:
        await service.stop()
        await drop_namespace(settings)
