"""The scheduler's pool statistics on the real broker: one bounded batch per interval.

Each PoolStats used to be one awaited send, for every name seen in the last 15 minutes: with many
client-chosen model names an interval's statistics took longer than the autoscaler's staleness cut
(30 s), and the real pools' reports were skipped as stale.
"""

from __future__ import annotations

import time

import pytest

from llmbus.bus import Bus, decode
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import PoolStats, now_ms
from llmbus.observability.metric_children import MODEL_LABELS
from llmbus.settings import BusSettings
from llmbus_services.scheduler.adapters.pool_stats import PoolStatsRecorder, publish_once
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.scheduler import SchedulerCore

pytestmark = pytest.mark.kafka

UNKNOWN_NAMES = 20_000
KNOWN_POOLS = 1_000


async def read_pool_stats(tail: TopicTail, expected: int) -> list[PoolStats]:
    got: list[PoolStats] = []
    async for record in tail.records(30):
        got.append(decode(record, PoolStats))  # type: ignore[arg-type]
        if len(got) >= expected:
            break
    async for record in tail.records(1.0):  # and nothing more
        got.append(decode(record, PoolStats))  # type: ignore[arg-type]
    return got


async def test_many_client_chosen_names_leave_the_real_pools_reports_fresh(bus_settings: BusSettings) -> None:
    core = SchedulerCore(Pipeline.load("default"))
    real_pools = [f"pool-known-{i}" for i in range(KNOWN_POOLS)]
    MODEL_LABELS.learn(real_pools)  # what the fleet and the registry name
    recorder = PoolStatsRecorder("i1", max_unknown_pools=32)
    now = now_ms()
    recorder.snapshot(core, now)
    for i in range(UNKNOWN_NAMES):
        recorder.on_arrival(f"minted-{i}", now)
    for pool in real_pools:
        recorder.on_arrival(pool, now)
    bus = await Bus.start(bus_settings, t.SCHEDULER)
    tail = await TopicTail(bus_settings, bus.topics.name(t.POOL_STATS)).start()
    try:
        started = time.monotonic()
        sent = await publish_once(bus, recorder, core)
        elapsed_s = time.monotonic() - started
        got = await read_pool_stats(tail, sent)
    finally:
        await tail.stop()
        await bus.stop()
    assert sent == KNOWN_POOLS + 32, sent  # every real pool, and only the 32 busiest other names
    assert {s.pool for s in got} >= set(real_pools) and len(got) == sent
    # One batch, acknowledged together: far inside the autoscaler's 30 s staleness cut.
    assert elapsed_s < 10.0, f"{sent} statistics took {elapsed_s:.1f}s"
    assert max(now_ms() - s.sent_at_ms for s in got) < 30_000
