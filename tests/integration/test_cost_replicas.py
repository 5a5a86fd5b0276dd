"""Two cost-accounting replicas on the real broker and Redis bill each GPU-millisecond once.

Results are keyed by request id, so each worker's requests land on both replicas' partitions of
llm.results. Before, each replica priced every worker's whole interval over its own share of the
requests: the workers' lives were billed 1.97x (busy time once per replica). Now the replica
holding a worker's lease prices all of its held results; the strict checker (a record id twice
counts as doubled even when identical) asserts every result billed once and each worker's
records adding up to its life's cost exactly.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest

from llmbus.audit.bills import check_bills
from llmbus.bus import Bus
from llmbus.bus.admin import open_admin
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    CostRecord,
    InferenceResult,
    ResultStatus,
    Timings,
    Usage,
    WorkerState,
    WorkerStatus,
)
from llmbus.settings import BusSettings
from llmbus.state.keys import cost_key_root
from llmbus.state.store import redis_client
from llmbus_tools.harness.service_procs import ServiceProc
from tests.integration.test_cost_e2e import caught_up, hosted_result, instance_cost_micro, read_log
from tests.support import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.redis]
# The workload is replayed into the past: its results wait for their workers' first heartbeat
# (published after them) longer than a real result would, so expiry is long here.
COST_ENV = {
    "LLMBUS_COST_GRACE_S": "1",
    "LLMBUS_COST_WORKER_EXPIRY_S": "600",
    "LLMBUS_COST_CLOSE_EVERY_S": "0.2",
    "LLMBUS_COST_SETTLE_S": "0",
}
LIFE_MS = 150_000
COLD_MS = 2_000
REQUEST_MS = 3_000


def workload(run: str, worker: str, started_ms: int) -> list[tuple[InferenceResult, int]]:
    """Two streams of back-to-back requests, one of them 70 s long (over interval + grace):
    (result, engine start)."""
    out = []
    for stream in range(2):
        at = started_ms + COLD_MS + 500 * stream
        i = 0
        while at + REQUEST_MS < started_ms + LIFE_MS - 1000:
            length = 70_000 if (stream, i) == (1, 5) else REQUEST_MS
            end = min(at + length, started_ms + LIFE_MS - 1000)
            result = InferenceResult(
                request_id=f"{run}-{worker}-{stream}-{i}",
                tenant="acme",
                status=ResultStatus.OK,
                model="sim-llama-8b",
                worker_id=worker,
                usage=Usage(prompt_tokens=200 + 37 * i % 300, completion_tokens=50 + 11 * i % 200),
                timings=Timings(engine_ms=float(end - at)),
                completed_at_ms=end,
                produced_by="engine-worker",
            )
            out.append((result, at))
            at, i = end + 100, i + 1
    return out


def heartbeats(worker: str, started_ms: int, spans: list[tuple[int, int]]) -> list[WorkerStatus]:
    beats = []
    for sent in range(started_ms, started_ms + LIFE_MS + 1, 1000):
        running = [start for start, end in spans if start <= sent < end]
        beats.append(
            WorkerStatus(
                worker_id=worker,
                node_id="n",
                state=WorkerState.STOPPED if sent == started_ms + LIFE_MS else WorkerState.READY,
                engine="sim",
                models=["sim-llama-8b"],
                cold_start_s=COLD_MS / 1000 if sent >= started_ms + COLD_MS else None,
                started_at_ms=started_ms,
                sent_at_ms=sent,
                num_requests_running=len(running),
                oldest_running_started_at_ms=min(running) if running else None,
            )
        )
    return beats


async def test_two_replicas_bill_each_result_once_and_each_worker_life_exactly(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    group = topics.group(t.COST, "results")
    for name in ("cost-a", "cost-b"):
        services.append(
            ServiceProc(
                "llmbus_services.cost_accounting", bus_settings, name=name, env=COST_ENV, log_dir=tmp_path
            ).start()
        )

    async def both_consume() -> bool:
        async with open_admin(bus_settings) as admin:
            [described] = await asyncio.wait_for(admin.describe_consumer_groups([group]), 10)
        _, _, state, _, _, members = described.groups[0][:6]
        return state == "Stable" and len(members) == 2

    await eventually(both_consume, timeout_s=120, interval_s=0.5)
    bus = await Bus.start(bus_settings, t.CLIENT)
    redis = redis_client(bus_settings.redis_url)
    run = uuid.uuid4().hex[:8]
    started_ms = int(time.time() * 1000) - LIFE_MS - 20_000
    try:
        work = {w: workload(run, w, started_ms + 7_000 * n) for n, w in enumerate(("w1", "w2"))}
        results = [r for pairs in work.values() for r, _ in pairs]
        results += [hosted_result(f"{run}-h{i}", "gpt-4.1", 500 + 10 * i, 0, 100) for i in range(12)]
        hit = hosted_result(f"{run}-hit", "gpt-4.1", 800, 0, 90)
        results.append(hit.model_copy(update={"cached": True, "produced_by": "router"}))
        for r in results:
            await bus.publisher.publish(topics.name(t.RESULTS), r, key=r.request_id)

        # Every result taken (billed, or held for its worker's intervals) before any heartbeat: none is late.
        async def all_taken() -> bool:
            keys = [f"{cost_key_root(bus_settings.topic_prefix)}seen:{r.request_key}" for r in results]
            return int(await redis.exists(*keys)) == len(keys)

        await eventually(all_taken, timeout_s=90, interval_s=0.5)
        lives = {}
        for n, (worker, pairs) in enumerate(work.items()):
            beats = heartbeats(worker, started_ms + 7_000 * n, [(at, r.completed_at_ms) for r, at in pairs])
            for beat in beats:
                await bus.publisher.publish(topics.name(t.WORKERS), beat, key=worker)
            lives[worker] = beats[-1]

        async def lives_closed() -> bool:
            cursors = await redis.hmget(f"{cost_key_root(bus_settings.topic_prefix)}cursor", list(lives))
            return all(c is not None and json.loads(c)["waste_booked"] for c in cursors)

        result_ids = {r.request_id for r in results}

        async def all_costed() -> bool:
            costs = await read_log(bus_settings, topics.name(t.COSTS), CostRecord)
            return result_ids <= {c.request_id for c in costs}

        await eventually(lives_closed, timeout_s=120, interval_s=0.5)
        await eventually(all_costed, timeout_s=90, interval_s=1)
        await eventually(lambda: caught_up(bus_settings, group, topics.name(t.RESULTS)), timeout_s=90, interval_s=0.5)
        costs = await read_log(bus_settings, topics.name(t.COSTS), CostRecord)
        report = check_bills(costs, result_ids, {w: instance_cost_micro(beat) for w, beat in lives.items()})
        print(f"two replicas: billed {report.ratio:.4f}x the workers' lives; {report}")
        assert report.ok, report
        assert report.ratio == 1.0 and report.billed == len(result_ids)
        # the long request paid for all of its GPU time, not only its last interval
        long = next(c for c in costs if c.request_id == f"{run}-w1-1-5")
        assert long.gpu_busy_ms == 70_000
        kinds = {c.kind for c in costs if c.worker_id in lives}
        assert {"self_hosted", "idle"} <= kinds and "unpriced" not in kinds, kinds
    finally:
        await redis.aclose()
        await bus.stop()
