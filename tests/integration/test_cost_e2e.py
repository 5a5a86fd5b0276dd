"""Cost-accounting on the real broker and Redis, with router, scheduler and a sim worker as processes.

Mixed traffic: self-hosted requests through the stack (sim worker), their shadow copies
(experiment), a router cache hit, and hosted results as an openai-http worker would publish
them. Expected totals are computed here from the price book and the worker's life, not
read back from the service; then llm.results is replayed twice and nothing is billed again.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from llmbus.bus import Bus, decode
from llmbus.bus.admin import open_admin
from llmbus.bus.catch_up import assigned_ends, read_to_end
from llmbus.bus.tables import read_table
from llmbus.client import LlmbusClient, TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    BookedTo,
    ChatMessage,
    CostKind,
    CostRecord,
    Experiment,
    InferenceRequest,
    InferenceResult,
    Message,
    ResultStatus,
    Usage,
    WorkerStatus,
)
from llmbus.settings import BusSettings
from llmbus.state.keys import cost_key_root
from llmbus.state.store import redis_client
from llmbus_services.cost_accounting.core.aggregates import agg_key, read_totals
from llmbus_services.cost_accounting.core.prices import MS_PER_HOUR, load_pricebook
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready
from tests.support import eventually, redis_keys, start_sim_stack

pytestmark = [pytest.mark.kafka, pytest.mark.redis]
BOOK = load_pricebook()
COST_ENV = {"LLMBUS_COST_GRACE_S": "1", "LLMBUS_COST_WORKER_EXPIRY_S": "5", "LLMBUS_COST_CLOSE_EVERY_S": "0.2"}


async def read_log(settings: BusSettings, topic: str, model: type[Message], timeout_s: float = 30) -> list:
    """Every record of `topic` from the start to its end as of now (bounded: a loaded machine is slow)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    out = []
    try:
        await asyncio.wait_for(consumer.start(), 30)
        ends = await assigned_ends(consumer, 30)
        async for record in read_to_end(consumer, ends, timeout_s, call_timeout_s=30):
            out.append(decode(record, model))  # type: ignore[arg-type]
    finally:
        await asyncio.wait_for(consumer.stop(), 30)
    return out


async def end_offsets(settings: BusSettings, topic: str, partitions: int) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    try:
        await asyncio.wait_for(consumer.start(), 30)
        ends = await asyncio.wait_for(consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)]), 30)
    finally:
        await asyncio.wait_for(consumer.stop(), 30)
    return {tp.partition: end for tp, end in ends.items()}


async def caught_up(settings: BusSettings, group: str, topic: str) -> bool:
    """The group has committed every record of `topic` (its handler ran on all, then committed)."""
    ends = await end_offsets(settings, topic, t.BY_NAME[topic.removeprefix(settings.topic_prefix)].partitions)
    async with open_admin(settings) as admin:
        committed = await asyncio.wait_for(admin.list_consumer_group_offsets(group), 30)
    done = {tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic}
    return all(done.get(p, 0) >= end for p, end in ends.items())


async def results_for(tail: TopicTail, request_ids: set[str], timeout_s: float) -> dict[str, InferenceResult]:
    """The first result of each id from the tail, returning as soon as all are in (bounded)."""
    found: dict[str, InferenceResult] = {}
    async for record in tail.records(timeout_s):
        result = decode(record, InferenceResult)  # type: ignore[arg-type]
        if result.request_id in request_ids:
            found.setdefault(result.request_id, result)
            if len(found) == len(request_ids):
                break
    return found


def hosted_result(rid: str, model: str, prompt: int, cached: int, completion: int, **kw: object) -> InferenceResult:
    return InferenceResult.model_validate(
        {
            "request_id": rid,
            "tenant": "acme",
            "status": ResultStatus.OK,
            "model": model,
            "worker_id": "openai-1",
            "usage": Usage(prompt_tokens=prompt, cached_prompt_tokens=cached, completion_tokens=completion),
            "produced_by": "engine-worker",
        }
        | kw
    )


def instance_cost_micro(status: WorkerStatus) -> int:
    """What the worker's life costs: per hour, R(instance-ms in the hour x rate), summed."""
    rate = BOOK.pool_rate("sim")
    start, end = status.started_at_ms, status.sent_at_ms
    total, hour = 0, start - start % MS_PER_HOUR
    while hour < end:
        total += rate.cost_micro(max(0, min(end, hour + MS_PER_HOUR) - max(start, hour)))
        hour += MS_PER_HOUR
    return total


async def test_mixed_traffic_totals_and_replay_bills_nothing_twice(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    bus = await Bus.start(bus_settings, t.CLIENT)
    exp = Experiment(
        experiment_id="shx", kind="shadow", match_models=["sim-llama-8b"], shadow_model="sim-llama-8b", shadow_share=1.0
    )
    await bus.publisher.publish(topics.name(t.EXPERIMENTS), exp, key=exp.experiment_id)
    worker = start_sim_stack(bus_settings, services, tmp_path, COST_ENV)
    await wait_workers_ready(bus_settings, {"w1"}, timeout_s=120)
    results_tail = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    run = uuid.uuid4().hex[:8]
    redis = redis_client(bus_settings.redis_url)
    try:
        asks = [
            InferenceRequest(
                request_id=f"{run}-{i}",
                tenant="acme",
                model="sim-llama-8b",
                temperature=0.0,
                max_tokens=16 + 8 * i,
                messages=[ChatMessage(role="user", content=f"question {i} " * (i + 1))],
            )
            for i in range(3)
        ]
        async with LlmbusClient(bus_settings) as client:
            for ask in asks:
                async for _ in client.stream(ask, timeout_s=60):
                    pass
            cache_key_prefix = f"llmbus:{bus_settings.topic_prefix}router:cache:*"

            async def cache_filled() -> bool:
                return bool(await redis_keys(redis, cache_key_prefix))

            await eventually(cache_filled, timeout_s=20)
            again = asks[0].model_copy(update={"request_id": f"{run}-again"})
            async for _ in client.stream(again, timeout_s=60):
                pass
        hosted = [
            hosted_result(f"{run}-h1", "gpt-4.1", 1200, 200, 300),
            hosted_result(f"{run}-h2", "gpt-4.1-mini", 5000, 0, 1000),
            hosted_result(f"{run}-h3", "gpt-4.1", 700, 0, 70, shadow=True, experiment_id="exp-h", variant="cand"),
        ]
        for r in hosted:
            await bus.publisher.publish(topics.name(t.RESULTS), r, key=r.request_id)
        ids = {a.request_id for a in asks} | {f"{a.request_id}.shadow.shx" for a in asks} | {again.request_id}
        # Shadow copies run after their primaries on the same worker: how long depends on the machine's load.
        found = await results_for(results_tail, ids, timeout_s=90)
        assert set(found) == ids, f"missing results: {ids - set(found)}"
        assert found[again.request_id].cached

        worker.terminate()  # drains, says STOPPED: the cost service closes its last interval
        table = await read_table(bus_settings, topics.name(t.WORKERS), WorkerStatus)
        final_beat = table["w1"]
        assert final_beat.state == "stopped"

        all_results = await read_log(bus_settings, topics.name(t.RESULTS), InferenceResult)
        result_ids = {r.request_id for r in all_results}

        # Done when (1) the ledger has closed w1's whole life: its cursor (saved after the records are
        # acked by Kafka and applied) says the cold-start waste is booked, which happens in the same
        # close as the final interval; (2) every result is costed; (3) the service has billed (and
        # committed) all of llm.results.
        # Each is a fact to wait for, not a time: under load any of them can take seconds.
        async def life_closed() -> bool:
            cursor = await redis.hget(f"{cost_key_root(bus_settings.topic_prefix)}cursor", "w1")
            return cursor is not None and bool(json.loads(cursor)["waste_booked"])

        async def all_costed() -> bool:
            costs = await read_log(bus_settings, topics.name(t.COSTS), CostRecord)
            return result_ids <= {c.request_id for c in costs}

        results_group = topics.group(t.COST, "results")

        async def aggregated() -> bool:
            return await caught_up(bus_settings, results_group, topics.name(t.RESULTS))

        await eventually(life_closed, timeout_s=90, interval_s=0.5)
        await eventually(all_costed, timeout_s=90, interval_s=1)
        await eventually(aggregated, timeout_s=90, interval_s=0.5)
        costs = await read_log(bus_settings, topics.name(t.COSTS), CostRecord)
        by_request = defaultdict(list)
        for c in costs:
            by_request[c.record_id].append(c)
        assert all(len(v) == 1 for v in by_request.values()), "a record was published twice"

        # hosted: tokens x prices, cached input at its own price
        h1, h2, h3 = (by_request[r.request_key][0] for r in hosted)  # record ids: `<tenant>:<request id>`
        assert h1.cost_micro_usd == 1000 * 2 + 200 * 0.5 + 300 * 8 and h1.kind == CostKind.HOSTED
        assert h2.cost_micro_usd == 5000 * 0.4 + 1000 * 1.6
        assert h3.booked_to == BookedTo.EXPERIMENT and h3.experiment_id == "exp-h"
        # the cache hit costs 0 and records what the model would have cost
        hit = by_request[again.request_key][0]
        assert hit.kind == CostKind.CACHE and hit.cost_micro_usd == 0 and hit.saving_micro_usd > 0
        # shadows of self-hosted requests are the experiment's
        for a in asks:
            shadow = by_request[f"acme:{a.request_id}.shadow.shx"][0]
            assert shadow.kind == CostKind.SELF_HOSTED and shadow.booked_to == BookedTo.EXPERIMENT
            assert shadow.experiment_id == "shx"
        # the worker's life: requests + idle + wasted cold start = instance-hours x price, exactly
        on_w1 = [c for c in costs if c.worker_id == "w1"]
        assert {c.kind for c in on_w1} >= {CostKind.SELF_HOSTED, CostKind.IDLE}, [
            (c.kind, c.cost_micro_usd) for c in on_w1
        ]
        # every request ran after the worker was ready, so each has GPU time (not only a cold-start share)
        assert all(c.gpu_busy_ms for c in on_w1 if c.kind == CostKind.SELF_HOSTED), final_beat
        assert sum(c.cost_micro_usd for c in on_w1) == instance_cost_micro(final_beat)

        # the aggregates agree with the records; the tenant's total leaves out shadows and idle
        async def day_totals(dim: str) -> dict[str, dict[str, int]]:
            keys = {agg_key(bus_settings.topic_prefix, "day", c.booked_at_ms, dim) for c in costs}
            merged: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
            for key in keys:
                raw = await redis.hgetall(key)
                for name, metrics in read_totals({k.decode(): int(v) for k, v in raw.items()}).items():
                    for m, n in metrics.items():
                        merged[name][m] += n
            return merged

        tenant_expected = sum(c.cost_micro_usd for c in costs if c.booked_to == BookedTo.TENANT)
        before = (await day_totals("tenant"))["acme"]["cost"], (await day_totals("total"))["all"]["cost"]
        assert before == (tenant_expected, sum(c.cost_micro_usd for c in costs))

        # replay llm.results twice (a consumer reset, a re-publish): nothing is billed again. Then one
        # sentinel per partition: once all are costed, every replayed record before them was read.
        for _ in range(2):
            for r in all_results:
                await bus.publisher.publish(topics.name(t.RESULTS), r, key=r.request_id)
        partitions = t.BY_NAME[t.RESULTS].partitions
        sentinels = [hosted_result(f"{run}-sentinel-{p}", "gpt-4.1-mini", 100, 0, 10) for p in range(partitions)]
        for p, r in enumerate(sentinels):
            await bus.publisher.publish(topics.name(t.RESULTS), r, key=r.request_id, partition=p)
        sentinel_ids = {r.request_id for r in sentinels}

        async def sentinels_costed() -> bool:
            logged = await read_log(bus_settings, topics.name(t.COSTS), CostRecord)
            return sentinel_ids <= {c.request_id for c in logged}

        await eventually(sentinels_costed, timeout_s=90, interval_s=1)
        await eventually(aggregated, timeout_s=90, interval_s=0.5)
        sentinel_micro = partitions * (100 * 0.4 + 10 * 1.6)
        assert len(await read_log(bus_settings, topics.name(t.COSTS), CostRecord)) == len(costs) + partitions
        after = (await day_totals("tenant"))["acme"]["cost"], (await day_totals("total"))["all"]["cost"]
        assert after == (before[0] + sentinel_micro, before[1] + sentinel_micro)
    finally:
        await results_tail.stop()
        await redis.aclose()
        await bus.stop()
