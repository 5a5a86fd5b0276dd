"""examples/cost_table.py against the real broker: exact per-tenant totals, a duplicate counted once."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import pytest

from llmbus.bus import Bus, make_producer
from llmbus.bus import headers as hdr
from llmbus.bus.producer import stop_producer
from llmbus.contract import topics as t
from llmbus.contract.messages import CostRecord
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import REPO

pytestmark = [pytest.mark.kafka]


def cost(request_id: str, tenant: str, micro_usd: int, prompt: int, completion: int) -> CostRecord:
    return CostRecord(
        request_id=request_id,
        record_id=request_id,
        tenant=tenant,
        model="m",
        cost_usd=micro_usd / 1e6,
        cost_micro_usd=micro_usd,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


async def test_the_example_prints_exact_totals_per_tenant(bus_settings: BusSettings) -> None:
    topic = t.Topics(bus_settings.topic_prefix).name(t.COSTS)
    records = [cost("r1", "acme", 1_250, 10, 20), cost("r2", "acme", 333, 5, 7), cost("r3", "globex", 9_001, 1, 2)]
    bus = await Bus.start(bus_settings, t.COST)  # cost-accounting's batch publish
    try:
        for batch in ([(r, r.to_bytes(), r.tenant) for r in records], [(records[0], records[0].to_bytes(), "acme")]):
            await bus.publisher.publish_many(topic, batch)  # 2nd: a redelivery
    finally:
        await bus.stop()
    # A later writer's record, with a field this reader has never heard of.
    newer = cost("r4", "globex", 7, 3, 4)
    payload = json.dumps(json.loads(newer.to_bytes()) | {"carbon_grams": 0.4}).encode()
    producer = make_producer(bus_settings, "test-example")
    await asyncio.wait_for(producer.start(), 30)
    try:
        await asyncio.wait_for(
            producer.send_and_wait(topic, payload, key=b"globex", headers=hdr.outgoing(newer, t.COST)), 20
        )
    finally:
        await stop_producer(producer, 10)

    run = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            str(REPO / "examples/cost_table.py"),
            "--bootstrap",
            bus_settings.kafka_bootstrap,
            "--topic",
            topic,
            "--max-records",
            "5",
            "--timeout",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env={"PATH": "/usr/bin:/bin"},  # no PYTHONPATH: the example must not need llmbus
    )
    assert run.returncode == 0, run.stderr
    final = run.stdout.split("final:\n", 1)[1]
    rows = {
        m[0]: tuple(map(int, m[1:])) for m in re.findall(r"^(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\S+$", final, re.M)
    }
    assert rows == {"acme": (2, 15, 27, 1_583), "globex": (2, 4, 6, 9_008)}
    assert "(4 records, 1 duplicates dropped, 0 skipped)" in final
